package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/kafka"
	"github.com/idemq/idemq/transports/kafka/franz"
	natssink "github.com/idemq/idemq/transports/nats"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// sinkConfig says where the relay publishes: routes from destinations to
// sinks, and the brokers those sinks use. It comes from the flags and,
// for what the flags leave unset, from a JSON file (--config):
//
//	{"routes": ["orders.*=kafka", "shipping.*=jetstream", "payments.*=kafka-tx"],
//	 "kafka_brokers": ["kafka:9092"], "nats_url": "nats://nats:4222",
//	 "kafka_tx_id_prefix": "billing-outbox-", "kafka_watermark_topic": "billing-outbox-watermarks",
//	 "webhooks": true, "webhook_allow_networks": ["10.0.0.0/8"]}
type sinkConfig struct {
	// Routes are PATTERN=SINK[:TARGET]. A PATTERN ending in * matches
	// destinations with that prefix, otherwise the destination exactly.
	// SINK is kafka (kafka-go), franz (franz-go, idempotent), kafka-tx
	// (franz-go, transactional: exactly once for read_committed
	// consumers), jetstream or nats (core NATS). TARGET is a fixed topic or
	// subject; without it the destination is the topic or subject.
	Routes       []string `json:"routes"`
	KafkaBrokers []string `json:"kafka_brokers"`
	// KafkaTxIDPrefix and KafkaWatermarkTopic configure the kafka-tx
	// routes' transactional ids (prefix + outbox partition) and watermark
	// topic; both must be unique to the outbox, and are required with a
	// kafka-tx route.
	KafkaTxIDPrefix     string `json:"kafka_tx_id_prefix"`
	KafkaWatermarkTopic string `json:"kafka_watermark_topic"`
	NATSURL             string `json:"nats_url"`
	// Webhooks routes the destinations webhook/<endpoint id> to the
	// webhook Sink, which reads the endpoint registry.
	Webhooks bool `json:"webhooks"`
	// WebhookAllowNetworks are CIDR prefixes the webhook Sink's SSRF
	// guard lets through (private networks are refused by default).
	WebhookAllowNetworks []string `json:"webhook_allow_networks"`
}

// The transactional id prefix and watermark topic the kafka-tx routes
// took by default before they had to be given. A fixed name is shared by
// every outbox on a Kafka cluster: two relays of different outboxes fenced
// each other's transactions without a word. Nothing derived from the
// relay's settings is unique either (two Postgres servers hold databases
// of the same name, and a host name changes with a failover), and a name
// that changes loses the watermarks that keep the transactions exactly
// once; so both are required, and the help names the old defaults for a
// relay that ran on them.
const (
	kafkaTxIDPrefixBefore     = "idemq-relay-"
	kafkaWatermarkTopicBefore = "idemq-relay-watermarks"
)

// topicMaxLen is the longest Kafka topic name (the broker's limit).
const topicMaxLen = 249

// validTopic refuses what a Kafka broker refuses as a topic name: empty,
// "." or "..", longer than 249 characters, or holding a character other
// than ASCII letters, digits, '.', '_' and '-'.
func validTopic(topic string) error {
	switch {
	case topic == "", topic == ".", topic == "..":
		return fmt.Errorf("%q is not a Kafka topic name", topic)
	case len(topic) > topicMaxLen:
		return fmt.Errorf("topic %.20q... is %d characters long: Kafka allows at most %d", topic, len(topic), topicMaxLen)
	}
	for _, r := range topic {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("topic %q holds %q: Kafka allows ASCII letters, digits, '.', '_' and '-'", topic, r)
		}
	}
	return nil
}

// readSinkConfig reads a --config file.
func readSinkConfig(path string) (sinkConfig, error) {
	var c sinkConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return c, usageError("--config: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, usageError("--config %s: %v", path, err)
	}
	// A second object (two files concatenated, a stray paste) would
	// otherwise be ignored without a word.
	if _, err := dec.Token(); err != io.EOF {
		return c, usageError("--config %s: want one JSON object, found more after it (at byte %d)", path, dec.InputOffset())
	}
	return c, nil
}

// route is one parsed PATTERN=SINK[:TARGET].
type route struct {
	spec    string // as given
	pattern string
	prefix  bool
	sink    string
	target  string
}

func parseRoute(s string) (route, error) {
	pattern, sink, ok := strings.Cut(s, "=")
	if !ok || pattern == "" || sink == "" {
		return route{}, usageError("route %q: want PATTERN=SINK[:TARGET], e.g. orders.*=kafka", s)
	}
	if strings.ContainsFunc(s, unicode.IsSpace) {
		// 'orders.* =nats' would route the destination "orders.* " exactly.
		return route{}, usageError("route %q: remove the blanks (want PATTERN=SINK[:TARGET], e.g. orders.*=kafka)", s)
	}
	r := route{spec: s, pattern: pattern}
	var hasTarget bool
	r.sink, r.target, hasTarget = strings.Cut(sink, ":")
	if hasTarget && r.target == "" {
		return route{}, usageError("route %q: empty TARGET after %q (drop the colon to publish to the destination's name)", s, r.sink+":")
	}
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		r.pattern, r.prefix = p, true
	}
	switch r.sink {
	case "kafka", "franz", "kafka-tx", "jetstream", "nats":
	default:
		return route{}, usageError("route %q: unknown sink %q (want kafka, franz, kafka-tx, jetstream or nats)", s, r.sink)
	}
	return r, nil
}

// kafka reports whether r's sink publishes to Kafka.
func (r route) kafka() bool { return r.sink == "kafka" || r.sink == "franz" || r.sink == "kafka-tx" }

// matches reports whether r routes destination; the longer pattern wins
// among prefixes, an exact one over any prefix (as relay.Router decides).
func (r route) matches(destination string) bool {
	if r.prefix {
		return strings.HasPrefix(destination, r.pattern)
	}
	return destination == r.pattern
}

// topicOf returns the Topic function of the kafka-tx routes' one TxSink:
// the target of the route the Router picked for a destination, or the
// destination itself.
func topicOf(routes []route) func(string) string {
	return func(dest string) string {
		var best *route
		for i := range routes {
			r := &routes[i]
			switch {
			case !r.matches(dest):
			case !r.prefix:
				best = r
			case best == nil || best.prefix && len(r.pattern) > len(best.pattern):
				best = r
			}
			if best != nil && !best.prefix {
				break
			}
		}
		if best == nil || best.target == "" {
			return dest
		}
		return best.target
	}
}

// add routes r's pattern to sink on router.
func (r route) add(router *relay.Router, sink relay.Sink) error {
	if r.prefix {
		return router.RoutePrefix(r.pattern, sink)
	}
	return router.Route(r.pattern, sink)
}

// sinkPlan is a sinkConfig whose every part was checked, before anything
// connects: routes parsed and tried on a router, brokers present for the
// sinks that need them, networks parsed.
type sinkPlan struct {
	sinkConfig
	routes []route
	allow  []netip.Prefix
	outbox string // relay.OutboxName, for the kafka-tx routes' TxSink
}

// plan checks c: every mistake in it is a usage error found before the
// relay touches the database or a broker.
func (c sinkConfig) plan() (sinkPlan, error) {
	p := sinkPlan{sinkConfig: c}
	if len(c.Routes) == 0 && !c.Webhooks {
		return p, usageError("no routes: give --route PATTERN=SINK or --webhooks (or \"routes\" in --config)")
	}
	for _, n := range c.WebhookAllowNetworks {
		prefix, err := netip.ParsePrefix(n)
		if err != nil {
			return p, usageError("--webhook-allow-network %q: %v", n, err)
		}
		p.allow = append(p.allow, prefix)
	}
	// The router's own checks (a duplicate route, a bad pattern) on a
	// scratch router with a sink that is never called.
	scratch := relay.NewRouter()
	nop := relay.SinkFunc(func(context.Context, relay.BatchID, []relay.Message) error { return nil })
	if c.Webhooks {
		if err := scratch.RoutePrefix(endpoints.DestinationPrefix, nop); err != nil {
			return p, usageError("webhooks: %w", err)
		}
	}
	for _, spec := range c.Routes {
		r, err := parseRoute(spec)
		switch {
		case err != nil:
			return p, err
		case r.kafka() && len(c.KafkaBrokers) == 0:
			return p, usageError("route %q needs --kafka-brokers", spec)
		case !r.kafka() && c.NATSURL == "":
			return p, usageError("route %q needs --nats-url", spec)
		}
		if err := r.add(scratch, nop); err != nil {
			return p, usageError("route %q: %w", spec, err)
		}
		if r.kafka() && r.target != "" {
			if err := validTopic(r.target); err != nil {
				return p, usageError("route %q: TARGET %w", spec, err)
			}
		}
		p.routes = append(p.routes, r)
	}
	return p, c.checkTx(p.routes)
}

// checkTx checks the settings of the kafka-tx routes, if any: a
// transactional id prefix and a valid watermark topic, both given, and no
// route publishing into the watermark topic.
func (c sinkConfig) checkTx(routes []route) error {
	if !slices.ContainsFunc(routes, func(r route) bool { return r.sink == "kafka-tx" }) {
		return nil
	}
	if c.KafkaTxIDPrefix == "" || c.KafkaWatermarkTopic == "" {
		return usageError("kafka-tx routes need --kafka-tx-id-prefix and --kafka-watermark-topic (or kafka_tx_id_prefix and kafka_watermark_topic "+
			"in --config), both unique to this outbox, e.g. billing-outbox- and billing-outbox-watermarks; a relay that ran on the defaults "+
			"of earlier versions keeps them with --kafka-tx-id-prefix %s --kafka-watermark-topic %s", kafkaTxIDPrefixBefore, kafkaWatermarkTopicBefore)
	}
	if err := validTopic(c.KafkaWatermarkTopic); err != nil {
		return usageError("--kafka-watermark-topic: %w", err)
	}
	for _, r := range routes {
		if r.kafka() && (r.target == c.KafkaWatermarkTopic || r.target == "" && !r.prefix && r.pattern == c.KafkaWatermarkTopic) {
			return usageError("route %q publishes into the watermark topic %s, which holds the kafka-tx routes' watermarks: route it elsewhere",
				r.spec, c.KafkaWatermarkTopic)
		}
	}
	return nil
}

// sinks holds the broker connections behind a Router, closed by close.
type sinks struct {
	router  *relay.Router
	closers []func()
}

func (s *sinks) close() {
	for _, c := range s.closers {
		c()
	}
}

// buildSinks connects to the brokers p needs and routes each pattern to
// its sink on router, wrapped by tel: each message sent gets a span whose
// context goes downstream in its headers, and webhook deliveries are
// counted.
func buildSinks(p sinkPlan, router *relay.Router, reg *endpoints.Registry, tel *otelidemq.Telemetry) (*sinks, error) {
	s := &sinks{router: router}
	if p.Webhooks {
		sink, err := webhook.NewSink(reg, webhook.Config{Hooks: tel.WebhookHooks(webhook.Hooks{}), AllowedNetworks: p.allow})
		if err == nil {
			err = router.RoutePrefix(endpoints.DestinationPrefix, tel.Sink("webhook", sink))
		}
		if err != nil {
			return nil, usageError("webhooks: %w", err)
		}
	}
	var (
		writer *kafkago.Writer
		nc     *nats.Conn
		js     jetstream.JetStream
		txSink *franz.TxSink // one for every kafka-tx route: one transactional id per outbox partition
		txs    []route
	)
	for _, r := range p.routes {
		if r.sink == "kafka-tx" {
			txs = append(txs, r)
		}
	}
	for _, r := range p.routes {
		topic := func(dest string) string { return dest }
		if r.target != "" {
			topic = func(string) string { return r.target }
		}
		var (
			sink   relay.Sink
			err    error
			system = r.sink
		)
		switch r.sink {
		case "kafka":
			if writer == nil {
				writer = kafka.NewWriter(p.KafkaBrokers...)
				s.closers = append(s.closers, func() { writer.Close() })
			}
			sink, err = kafka.NewSink(writer, kafka.SinkConfig{Topic: topic})
		case "franz":
			system = "kafka"
			var fs *franz.Sink
			if fs, err = franz.NewSink(franz.SinkConfig{Topic: topic}, kgo.SeedBrokers(p.KafkaBrokers...)); err == nil {
				s.closers = append(s.closers, fs.Close)
				sink = fs
			}
		case "kafka-tx":
			system = "kafka"
			if txSink == nil {
				txSink, err = franz.NewTxSink(franz.TxConfig{
					Outbox:                p.outbox,
					SinkConfig:            franz.SinkConfig{Topic: topicOf(txs)},
					TransactionalIDPrefix: p.KafkaTxIDPrefix,
					WatermarkTopic:        p.KafkaWatermarkTopic,
				}, kgo.SeedBrokers(p.KafkaBrokers...))
				if err == nil {
					s.closers = append(s.closers, txSink.Close)
				}
			}
			sink = txSink
		case "jetstream", "nats":
			system = "nats"
			if nc == nil {
				if nc, err = nats.Connect(p.NATSURL, nats.Name("idemq relay"), nats.MaxReconnects(-1)); err != nil {
					s.close()
					return nil, fmt.Errorf("nats %s: %w", p.NATSURL, err)
				}
				s.closers = append(s.closers, nc.Close)
			}
			if r.sink == "nats" {
				sink, err = natssink.NewCoreSink(nc, natssink.SinkConfig{Subject: topic})
				break
			}
			if js == nil {
				if js, err = jetstream.New(nc); err != nil {
					s.close()
					return nil, err
				}
			}
			sink, err = natssink.NewJetStreamSink(js, natssink.SinkConfig{Subject: topic})
		}
		if err == nil {
			err = r.add(router, tel.Sink(system, sink))
		}
		if err != nil {
			s.close()
			return nil, usageError("route %q: %w", r.spec, err)
		}
	}
	return s, nil
}
