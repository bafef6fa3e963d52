package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/kafka"
	natssink "github.com/idemq/idemq/transports/nats"
	"github.com/idemq/idemq/transports/webhook"
)

// sinkConfig says where the relay publishes: routes from destinations to
// sinks, and the brokers those sinks use. It comes from the flags and,
// for what the flags leave unset, from a JSON file (--config):
//
//	{"routes": ["orders.*=kafka", "shipping.*=jetstream"],
//	 "kafka_brokers": ["kafka:9092"], "nats_url": "nats://nats:4222",
//	 "webhooks": true, "webhook_allow_networks": ["10.0.0.0/8"]}
type sinkConfig struct {
	// Routes are PATTERN=SINK[:TARGET]. A PATTERN ending in * matches
	// destinations with that prefix, otherwise the destination exactly.
	// SINK is kafka, jetstream or nats (core NATS). TARGET is a fixed topic or
	// subject; without it the destination is the topic or subject.
	Routes       []string `json:"routes"`
	KafkaBrokers []string `json:"kafka_brokers"`
	NATSURL      string   `json:"nats_url"`
	// Webhooks routes the destinations webhook/<endpoint id> to the
	// webhook Sink, which reads the endpoint registry.
	Webhooks bool `json:"webhooks"`
	// WebhookAllowNetworks are CIDR prefixes the webhook Sink's SSRF
	// guard lets through (private networks are refused by default).
	WebhookAllowNetworks []string `json:"webhook_allow_networks"`
}

// readSinkConfig reads a --config file.
func readSinkConfig(path string) (sinkConfig, error) {
	var c sinkConfig
	data, err := os.ReadFile(path)
	if err != nil {
		return c, usageError("--config: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, usageError("--config %s: %v", path, err)
	}
	return c, nil
}

// route is one parsed PATTERN=SINK[:TARGET].
type route struct {
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
	r := route{pattern: pattern}
	r.sink, r.target, _ = strings.Cut(sink, ":")
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		r.pattern, r.prefix = p, true
	}
	switch r.sink {
	case "kafka", "jetstream", "nats":
	default:
		return route{}, usageError("route %q: unknown sink %q (want kafka, jetstream or nats)", s, r.sink)
	}
	return r, nil
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

// buildSinks connects to the brokers the routes need and routes each
// pattern to its sink, wrapped by tel: each message sent gets a span whose
// context goes downstream in its headers, and webhook deliveries are
// counted.
func buildSinks(c sinkConfig, reg *webhook.Registry, tel *otelidemq.Telemetry) (*sinks, error) {
	if len(c.Routes) == 0 && !c.Webhooks {
		return nil, usageError("no routes: give --route PATTERN=SINK or --webhooks (or \"routes\" in --config)")
	}
	s := &sinks{router: relay.NewRouter()}
	if c.Webhooks {
		cfg := webhook.Config{Hooks: tel.WebhookHooks(webhook.Hooks{})}
		for _, n := range c.WebhookAllowNetworks {
			p, err := netip.ParsePrefix(n)
			if err != nil {
				return nil, usageError("--webhook-allow-network %q: %v", n, err)
			}
			cfg.AllowedNetworks = append(cfg.AllowedNetworks, p)
		}
		sink, err := webhook.NewSink(reg, cfg)
		if err == nil {
			err = s.router.RoutePrefix(webhook.DestinationPrefix, tel.Sink("webhook", sink))
		}
		if err != nil {
			return nil, usageError("webhooks: %w", err)
		}
	}
	var (
		writer *kafkago.Writer
		nc     *nats.Conn
		js     jetstream.JetStream
	)
	for _, spec := range c.Routes {
		r, err := parseRoute(spec)
		if err != nil {
			s.close()
			return nil, err
		}
		topic := func(dest string) string { return dest }
		if r.target != "" {
			topic = func(string) string { return r.target }
		}
		var (
			sink   relay.Sink
			system = r.sink
		)
		switch r.sink {
		case "kafka":
			if len(c.KafkaBrokers) == 0 {
				s.close()
				return nil, usageError("route %q needs --kafka-brokers", spec)
			}
			if writer == nil {
				writer = kafka.NewWriter(c.KafkaBrokers...)
				s.closers = append(s.closers, func() { writer.Close() })
			}
			sink, err = kafka.NewSink(writer, kafka.SinkConfig{Topic: topic})
		case "jetstream", "nats":
			system = "nats"
			if c.NATSURL == "" {
				s.close()
				return nil, usageError("route %q needs --nats-url", spec)
			}
			if nc == nil {
				if nc, err = nats.Connect(c.NATSURL, nats.Name("idemq relay"), nats.MaxReconnects(-1)); err != nil {
					s.close()
					return nil, fmt.Errorf("nats %s: %w", c.NATSURL, err)
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
			sink = tel.Sink(system, sink)
			if r.prefix {
				err = s.router.RoutePrefix(r.pattern, sink)
			} else {
				err = s.router.Route(r.pattern, sink)
			}
		}
		if err != nil {
			s.close()
			return nil, usageError("route %q: %w", spec, err)
		}
	}
	return s, nil
}
