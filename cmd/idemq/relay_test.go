package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// enqueue writes n messages to dest, keyed over keys, in batches, and
// returns their ids in enqueue order.
func enqueue(t *testing.T, ob *outbox.Outbox, dest string, n, keys int) []string {
	t.Helper()
	var ids []string
	var batch []outbox.Message
	for i := range n {
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: fmt.Sprint("key-", i%keys), Payload: fmt.Appendf(nil, "%d", i)}
		ids = append(ids, m.ID.String())
		batch = append(batch, m)
		if len(batch) == 500 || i == n-1 {
			if err := ob.Enqueue(context.Background(), batch...); err != nil {
				t.Fatal(err)
			}
			batch = nil
		}
	}
	return ids
}

// The relay drains an outbox into JetStream and Kafka, answers its health
// checks and metrics, and exits cleanly on SIGTERM.
func TestRelayDrainsIntoNATSAndKafka(t *testing.T) {
	t.Parallel()
	url, pool, ob := database(t)
	ctx := context.Background()
	ns := testenv.NATS(t)
	nc := ns.ConnectTB(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := ns.Name("orders")
	stream, err := ns.CreateStream(ctx, js, jetstream.StreamConfig{Name: ns.Name("ORDERS"), Subjects: []string{subject + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 3, "billing")
	topic := kc.Topic("billing")

	const n = 300
	natsIDs := enqueue(t, ob, subject+".created", n, 7)
	kafkaIDs := enqueue(t, ob, topic, n, 7)

	// Routes and Kafka from a config file, NATS and the HTTP address from
	// the environment.
	config := filepath.Join(t.TempDir(), "relay.json")
	data, err := json.Marshal(sinkConfig{Routes: []string{subject + ".*=jetstream", topic + "=kafka"}, KafkaBrokers: kc.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, data, 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := startEnv(t, env("DATABASE_URL="+url, "IDEMQ_NATS_URL="+ns.URL, "IDEMQ_HTTP_ADDR="+addr),
		"relay", "--config", config, "--shutdown-grace", "5s", "--stats-interval", "100ms")

	readyz := func(want int) func() error {
		return func() error {
			code, body, err := get("http://" + addr + "/readyz")
			if err == nil && code != want {
				err = fmt.Errorf("readyz %d, want %d: %s", code, want, body)
			}
			return err
		}
	}
	idemqtest.WaitForNoError(t, "readyz", readyz(200))
	if code, body, err := get("http://" + addr + "/healthz"); err != nil || code != 200 || !strings.Contains(body, `"relay_loop":"ok"`) {
		t.Errorf("healthz: %d %s %v", code, body, err)
	}
	idemqtest.WaitForNoError(t, "outbox drained", func() error {
		if p := pending(t, ob); p > 0 {
			return fmt.Errorf("%d pending", p)
		}
		return nil
	})

	// JetStream: every message once, its id in Nats-Msg-Id.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// Every message also carries the trace context of its send span.
	var gotNATS []string
	traced := 0
	for len(gotNATS) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatalf("after %d JetStream messages: %v", len(gotNATS), err)
		}
		gotNATS = append(gotNATS, msg.Headers().Get(jetstream.MsgIDHeader))
		if msg.Headers().Get("traceparent") != "" {
			traced++
		}
	}
	if info, err := stream.Info(ctx); err != nil || info.State.Msgs != n {
		t.Errorf("stream holds %v messages (%v), want %d", info.State.Msgs, err, n)
	}
	sameSet(t, "JetStream", gotNATS, natsIDs)

	// Kafka: every message once, its id in Idempotency-Key.
	msgs, err := kc.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var gotKafka []string
	for _, m := range msgs {
		for _, h := range m.Headers {
			switch h.Key {
			case "Idempotency-Key":
				gotKafka = append(gotKafka, string(h.Value))
			case "traceparent":
				traced++
			}
		}
	}
	if len(msgs) != n {
		t.Errorf("Kafka holds %d messages, want %d", len(msgs), n)
	}
	if traced != 2*n {
		t.Errorf("%d of the %d messages published carry a traceparent", traced, 2*n)
	}
	sameSet(t, "Kafka", gotKafka, kafkaIDs)

	idemqtest.WaitForNoError(t, "metrics", func() error {
		_, body, err := get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		for _, want := range []struct{ name, label, value string }{
			{"messaging_client_sent_messages_total{", fmt.Sprintf("messaging_destination_name=%q", topic), fmt.Sprint(n)},
			{"messaging_client_sent_messages_total{", fmt.Sprintf("messaging_destination_name=%q", subject+".created"), fmt.Sprint(n)},
			{"idemq_outbox_pending{", "", "0"},
			{"idemq_outbox_oldest_pending_age_seconds{", "", ""},
			{"idemq_outbox_partition_token{", `idemq_outbox_partition="0"`, ""},
			{"idemq_relay_liveness_remaining_seconds{", "", ""},
			{"messaging_client_operation_duration_seconds_count{", "", ""},
			{"target_info{", `service_name="idemq"`, "1"},
			{"go_goroutines", "", ""},
		} {
			if !slices.ContainsFunc(strings.Split(body, "\n"), func(line string) bool {
				return strings.HasPrefix(line, want.name) && strings.Contains(line, want.label) &&
					(want.value == "" || strings.HasSuffix(line, " "+want.value))
			}) {
				return fmt.Errorf("no %s%s...} %s in /metrics:\n%s", want.name, want.label, want.value, body)
			}
		}
		return nil
	})

	// A schema that is no longer current makes the relay unready, and
	// ready again once it is back; liveness does not depend on it.
	if _, err := pool.Exec(ctx, `ALTER TABLE idemq_migrations RENAME TO idemq_migrations_away`); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitForNoError(t, "unready without the schema", readyz(503))
	if code, _, err := get("http://" + addr + "/healthz"); err != nil || code != 200 {
		t.Errorf("healthz %d, %v while the schema is away; want 200", code, err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE idemq_migrations_away RENAME TO idemq_migrations`); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitForNoError(t, "ready again", readyz(200))

	if code := p.signal(t, syscall.SIGTERM, 5*time.Second+30*time.Second); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), `"msg":"relay stopped"`) {
		t.Errorf("no clean stop in the log:\n%s", p.stderr.String())
	}
}

// A relay stopped by SIGTERM mid-run and another killed by SIGKILL mid-run
// lose nothing: a third finishes, every message reaches Kafka, duplicates
// (from the kill between publish and delete) carry the same id, and the
// first copy of each key's messages arrives in enqueue order.
func TestRelaySIGTERMAndSIGKILLLoseNothing(t *testing.T) {
	t.Parallel()
	url, _, ob := database(t)
	ctx := context.Background()
	kc := testenv.Kafka(t, 3, "ledger")
	topic := kc.Topic("ledger")
	const n = 6000
	ids := enqueue(t, ob, topic, n, 50)

	args := []string{"relay", "--batch-size", "20", "--shutdown-grace", "5s", "--route", topic + "=kafka", "--kafka-brokers", strings.Join(kc.Brokers, ",")}
	progressed := func(below int64) func() error {
		return func() error {
			if p := pending(t, ob); p >= below {
				return fmt.Errorf("%d pending", p)
			}
			return nil
		}
	}

	first := start(t, url, args...)
	idemqtest.WaitForNoError(t, "first relay publishing", progressed(n-100))
	if code := first.signal(t, syscall.SIGTERM, 5*time.Second+30*time.Second); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM\n%s", code, first.stderr.String())
	}
	afterTerm := pending(t, ob)

	second := start(t, url, args...)
	idemqtest.WaitForNoError(t, "second relay publishing", progressed(afterTerm-100))
	second.signal(t, syscall.SIGKILL, 30*time.Second)
	afterKill := pending(t, ob)

	third := start(t, url, args...)
	idemqtest.WaitForNoError(t, "outbox drained", progressed(1))
	if code := third.signal(t, syscall.SIGTERM, 5*time.Second+30*time.Second); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM\n%s", code, third.stderr.String())
	}

	msgs, err := kc.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	firstSeen := map[string]bool{}
	var order []string // ids in the order of their first copy, per partition
	byKey := map[string][]string{}
	for _, m := range msgs {
		var id string
		for _, h := range m.Headers {
			if h.Key == "Idempotency-Key" {
				id = string(h.Value)
			}
		}
		if firstSeen[id] {
			continue
		}
		firstSeen[id] = true
		order = append(order, id)
		byKey[string(m.Key)] = append(byKey[string(m.Key)], id)
	}
	sameSet(t, "Kafka (distinct ids)", order, ids)
	t.Logf("%d messages: %d on the topic, %d duplicates; pending after SIGTERM %d, after SIGKILL %d",
		n, len(msgs), len(msgs)-len(order), afterTerm, afterKill)
	// Per-key order: the first copies of a key's messages, read from its
	// partition, follow enqueue order (UUIDv7 ids enqueued one after the
	// other sort in that order).
	for key, got := range byKey {
		if !slices.IsSorted(got) {
			t.Errorf("key %s: messages out of enqueue order", key)
		}
	}
}

// sameSet checks that got holds exactly the ids of want, each once.
func sameSet(t *testing.T, what string, got, want []string) {
	t.Helper()
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		t.Errorf("%s: %d ids, want the %d enqueued ones, each once", what, len(g), len(w))
	}
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set the relay exports its metrics and
// its send spans over OTLP/HTTP. The span continues the trace stored in the
// outbox row, and the message published carries the span's own context.
func TestRelayExportsOTLP(t *testing.T) {
	t.Parallel()
	url, _, ob := database(t)
	ns := testenv.NATS(t)
	nc := ns.ConnectTB(t)
	sub, err := nc.SubscribeSync(ns.Name("audit"))
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		t.Fatal(err)
	}
	var (
		metrics = make(chan struct{}, 1)
		spans   = make(chan *tracepb.Span, 10)
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch r.URL.Path {
		case "/v1/metrics":
			select {
			case metrics <- struct{}{}:
			default:
			}
		case "/v1/traces":
			var req coltracepb.ExportTraceServiceRequest
			if err := proto.Unmarshal(body, &req); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			for _, rs := range req.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					for _, s := range ss.Spans {
						spans <- s
					}
				}
			}
		}
	}))
	t.Cleanup(collector.Close)

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	msg := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: ns.Name("audit"), Payload: []byte("{}"),
		Headers: map[string]string{"traceparent": "00-" + traceID + "-" + parentID + "-01"}}
	if err := ob.Enqueue(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	p := startEnv(t, env("DATABASE_URL="+url, "OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL,
		"OTEL_METRIC_EXPORT_INTERVAL=100", "OTEL_BSP_SCHEDULE_DELAY=100"),
		"relay", "--route", msg.Destination+"=nats", "--nats-url", ns.URL)
	receive(t, metrics)
	span := receive(t, spans)
	if span.Name != "send "+msg.Destination || span.Kind != tracepb.Span_SPAN_KIND_PRODUCER ||
		hex.EncodeToString(span.TraceId) != traceID || hex.EncodeToString(span.ParentSpanId) != parentID {
		t.Errorf("exported span %q kind %v trace %x parent %x; want send %s, a producer, child of %s-%s",
			span.Name, span.Kind, span.TraceId, span.ParentSpanId, msg.Destination, traceID, parentID)
	}
	published, err := sub.NextMsg(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := published.Header.Get("traceparent"), "00-"+traceID+"-"+hex.EncodeToString(span.SpanId)+"-01"; got != want {
		t.Errorf("the NATS message carries traceparent %q, want the send span's %q", got, want)
	}
	if code := p.signal(t, syscall.SIGTERM, time.Minute); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM", code)
	}
}

// TestRelayLogsDurationsAsText: the JSON log printed durations as raw
// nanoseconds ("retry_in":69849693). They print as Go durations, in the
// line that says a destination is held as in the start line.
func TestRelayLogsDurationsAsText(t *testing.T) {
	t.Parallel()
	url, _, ob := database(t)
	if err := ob.Enqueue(context.Background(), outbox.Message{Destination: "unrouted.orders", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	p := start(t, url, "relay", "--migrate", "--webhooks", "--log-format", "json", "--lease-ttl", "1500ms")
	lines := map[string]map[string]any{}
	idemqtest.WaitForNoError(t, "the start and the hold logged", func() error {
		for line := range strings.Lines(p.stderr.String()) {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil {
				lines[fmt.Sprint(rec["msg"])] = rec
			}
		}
		for msg := range lines {
			if strings.HasPrefix(msg, "relay: holding the messages") {
				lines["held"] = lines[msg]
			}
		}
		if lines["relay starting"] == nil || lines["held"] == nil {
			return fmt.Errorf("no start or hold line yet:\n%s", p.stderr.String())
		}
		return nil
	})
	for _, c := range []struct{ line, attr, want string }{
		{"relay starting", "lease_ttl", "1.5s"},
		{"relay starting", "publish_timeout", "30s"},
		{"held", "retry_in", ""},
	} {
		v, ok := lines[c.line][c.attr].(string)
		if _, err := time.ParseDuration(v); !ok || err != nil || c.want != "" && v != c.want {
			t.Errorf("%s line: %s is %#v, want a duration as text %s", c.line, c.attr, lines[c.line][c.attr], c.want)
		}
	}
}

// TestRelayRunsMaintenance: the binary's relay runs the maintenance chores
// by default, so a dead letter stored without its class (by a version
// before classes) gets one without idemq dlq classify.
func TestRelayRunsMaintenance(t *testing.T) {
	t.Parallel()
	url, pool, _ := database(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO idemq_outbox_dead (seq, id, created_at, failed_at, attempts, destination, payload, key, last_error)
		VALUES (nextval(pg_get_serial_sequence('idemq_outbox', 'seq')), gen_random_uuid(), now(), now(), 5, 'orders', '\x7b7d', 'k', 'HTTP 503: upstream unavailable')`); err != nil {
		t.Fatal(err)
	}
	kc := testenv.Kafka(t, 1, "orders")
	relay := start(t, url, "relay", "--route", "orders="+"kafka:"+kc.Topic("orders"), "--kafka-brokers", strings.Join(kc.Brokers, ","))
	idemqtest.WaitForNoError(t, "the dead letter classified", func() error {
		var class *string
		if err := pool.QueryRow(ctx, `SELECT error_class FROM idemq_outbox_dead`).Scan(&class); err != nil {
			return err
		}
		if class == nil {
			return errors.New("no class yet")
		}
		return nil
	})
	if code := relay.signal(t, syscall.SIGTERM, time.Minute); code != 0 {
		t.Fatalf("relay exit %d\n%s", code, relay.stderr.String())
	}
}
