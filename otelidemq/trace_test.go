package otelidemq_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// W3C trace context through the global propagator, which the Telemetry
// and the outbox (OutboxHeaders(nil)) of these tests use. Tests that set
// it do not run in parallel.
func useTraceContext(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// One order written by an API request and its two outbox messages, one to
// Kafka and one to JetStream, published by a relay and applied by a
// consumer on each broker (through ProcessBatch on Kafka, Process on
// JetStream): every span, from the request to each
// consumer's process span, is in the request's trace, each the child of
// the step before it; the NATS headers carry lower-case names.
func TestTraceFromRequestThroughOutboxToConsumers(t *testing.T) {
	useTraceContext(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tel := newTelemetry(t)

	pool := testenv.Postgres(t)
	k := testenv.Kafka(t, 1, "orders")
	n := testenv.NATS(t)
	nc := n.ConnectTB(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	topic, subject := k.Topic("orders"), n.Name("orders")
	stream, err := n.CreateStream(ctx, js, jetstream.StreamConfig{Name: n.Name("ORDERS"), Subjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}

	// The business transaction, inside the API request's span.
	ob := newOutbox(t, pool)
	reqCtx, request := tel.tp.Tracer("api").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	err = pgx.BeginFunc(reqCtx, pool, func(tx pgx.Tx) error {
		return ob.EnqueueTx(reqCtx, tx,
			outbox.Message{Destination: topic, Key: "o-1", Payload: []byte("o-1")},
			outbox.Message{Destination: subject, Key: "o-1", Payload: []byte("o-1")})
	})
	request.End()
	if err != nil {
		t.Fatal(err)
	}

	// Consumers: billing on Kafka, shipping on JetStream.
	var mu sync.Mutex
	headers := map[string]map[string]string{} // scope -> headers seen
	applied := make(chan string, 2)
	newConsumer := func(scope, system, destination string, cfg consumer.Config) *consumer.Consumer {
		h := tel.Handler(system, destination, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			mu.Lock()
			headers[scope] = msg.Headers
			mu.Unlock()
			return nil
		})
		cfg.Hooks = tel.ConsumerHooks(consumer.Hooks{OnResult: func(e consumer.ResultEvent) {
			if e.Outcome == consumer.Applied {
				applied <- e.Scope
			}
		}})
		c, err := consumer.New(pool, scope, h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return c
	}
	billing := newConsumer("billing", "kafka", topic, consumer.Config{})
	shipping := newConsumer("shipping", "nats", subject, consumer.Config{Redeliver: true})
	kafkaSub, err := idemqkafka.NewSubscriber(billing, idemqkafka.SubscriberConfig{
		Brokers: k.Brokers, GroupID: k.Group("billing"), Topics: []string{topic}, Logger: quiet,
		Batch: true, // through ProcessBatch
	})
	if err != nil {
		t.Fatal(err)
	}
	durable, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "shipping", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	natsSub, err := idemqnats.NewJetStreamSubscriber(shipping, durable, js, idemqnats.JetStreamSubscriberConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	// The relay, each Sink wrapped.
	w := idemqkafka.NewWriter(k.Brokers...)
	t.Cleanup(func() { w.Close() })
	kafkaSink, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	natsSink, err := idemqnats.NewJetStreamSink(js, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	router := relay.NewRouter()
	if err := router.Route(topic, tel.Sink("kafka", kafkaSink)); err != nil {
		t.Fatal(err)
	}
	if err := router.Route(subject, tel.Sink("nats", natsSink)); err != nil {
		t.Fatal(err)
	}
	backlog := make(chan struct{}, 1)
	rl, err := relay.New(pool, ob, router, relay.Config{Logger: quiet, StatsInterval: 10 * time.Millisecond,
		Hooks: tel.RelayHooks(relay.Hooks{OnBacklog: func(relay.BacklogEvent) {
			select {
			case backlog <- struct{}{}:
			default:
			}
		}})})
	if err != nil {
		t.Fatal(err)
	}

	for _, svc := range []idemq.Service{kafkaSub, natsSub, rl} {
		running, err := idemq.Start(ctx, svc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := running.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case s := <-applied:
			got[s] = true
		case <-ctx.Done():
			t.Fatalf("applied %v before the deadline", got)
		}
	}
	<-backlog

	// The spans: request -> send (one per message) -> process.
	want := request.SpanContext()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range tel.spans.Ended() {
		if s.SpanContext().TraceID() != want.TraceID() {
			t.Errorf("span %q in trace %s, want the request's %s", s.Name(), s.SpanContext().TraceID(), want.TraceID())
		}
		byName[s.Name()] = s
	}
	for _, dest := range []string{topic, subject} {
		send, process := byName["send "+dest], byName["process "+dest]
		if send == nil || process == nil {
			t.Fatalf("spans for %s: send %v, process %v; have %v", dest, send != nil, process != nil, names(tel.spans.Ended()))
		}
		if send.Parent().SpanID() != want.SpanID() {
			t.Errorf("send %s: parent %s, want the request span %s", dest, send.Parent().SpanID(), want.SpanID())
		}
		if l := send.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != want.SpanID() {
			t.Errorf("send %s: links %v, want one to the request span", dest, l)
		}
		if process.Parent().SpanID() != send.SpanContext().SpanID() {
			t.Errorf("process %s: parent %s, want the send span %s", dest, process.Parent().SpanID(), send.SpanContext().SpanID())
		}
		if send.SpanKind() != trace.SpanKindProducer || process.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("%s: kinds %v and %v", dest, send.SpanKind(), process.SpanKind())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for scope, h := range headers {
		if _, ok := h["traceparent"]; !ok {
			t.Errorf("%s: no lower-case traceparent header in %v", scope, h)
		}
	}

	// The metrics of the same run.
	m := collect(t, tel.reader)
	if got := m.sum("messaging.client.sent.messages", nil); got != 2 {
		t.Errorf("messaging.client.sent.messages = %d, want 2", got)
	}
	for _, scope := range []string{"billing", "shipping"} {
		if got := m.sum("idemq.consumer.messages", map[string]string{"idemq.scope": scope, "idemq.outcome": "applied"}); got != 1 {
			t.Errorf("idemq.consumer.messages{%s, applied} = %d, want 1", scope, got)
		}
	}
	for _, name := range []string{"messaging.process.duration", "messaging.client.operation.duration", "idemq.outbox.pending", "idemq.outbox.oldest_pending.age", "idemq.outbox.dead_letters"} {
		if !m.has(name) {
			t.Errorf("no %s recorded", name)
		}
	}
}

// newOutbox returns the default outbox on pool, migrated.
func newOutbox(t *testing.T, pool *pgxpool.Pool) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(pool, outbox.Config{Headers: otelidemq.OutboxHeaders(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return ob
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

// A message enqueued with its own traceparent keeps it: the caller's
// creation context is not replaced by the ambient one.
func TestEnqueueKeepsAGivenTraceContext(t *testing.T) {
	useTraceContext(t)
	ctx := t.Context()
	tp := sdktrace.NewTracerProvider()
	pool := testenv.Postgres(t)
	ob := newOutbox(t, pool)
	ctx, span := tp.Tracer("test").Start(ctx, "enqueue")
	defer span.End()
	given := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	in := []outbox.Message{
		{ID: uuid.Must(uuid.NewV7()), Destination: "d", Headers: map[string]string{"traceparent": given}},
		{ID: uuid.Must(uuid.NewV7()), Destination: "d"},
	}
	if err := ob.Enqueue(ctx, in...); err != nil {
		t.Fatal(err)
	}
	if len(in[1].Headers) != 0 {
		t.Errorf("the caller's message was changed: %v", in[1].Headers)
	}
	ambient := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, ambient)
	want := map[uuid.UUID]string{in[0].ID: given, in[1].ID: ambient["traceparent"]}
	rows, err := pool.Query(ctx, `SELECT id, headers->>'traceparent' FROM idemq_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; rows.Next(); n++ {
		var id uuid.UUID
		var tp *string
		if err := rows.Scan(&id, &tp); err != nil {
			t.Fatal(err)
		}
		if tp == nil || *tp != want[id] {
			t.Errorf("row %s: traceparent %v, want %s", id, tp, want[id])
		}
	}
	if err := rows.Err(); err != nil || n != len(in) {
		t.Fatalf("%d rows, %v", n, err)
	}
}

// A leased consumer's handler runs in a process span, child of the
// message's trace context, and sees that span in its ctx.
func TestLeasedHandlerContinuesTheTrace(t *testing.T) {
	useTraceContext(t)
	ctx := t.Context()
	tel := newTelemetry(t)
	var inHandler trace.SpanContext
	c, err := consumer.NewLeased(testenv.Postgres(t), "mailer", tel.LeasedHandler("nats", "mails", func(ctx context.Context, msg *consumer.Message, lease idemq.Lease) error {
		inHandler = trace.SpanContextFromContext(ctx)
		return nil
	}), consumer.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	producer, span := tel.tp.Tracer("test").Start(ctx, "send mails")
	span.End()
	headers := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(producer, headers)
	// HTTP-style names: the handler reads them whatever their case.
	msg := &consumer.Message{ID: "mail-1", Payload: []byte("hi"), Headers: map[string]string{"Traceparent": headers["traceparent"]}}
	if r := c.Process(ctx, msg); r.Outcome != consumer.Applied {
		t.Fatalf("%v: %v", r.Outcome, r.Err)
	}
	processed := tel.ended("process mails")
	if len(processed) != 1 {
		t.Fatalf("%d process spans", len(processed))
	}
	switch process := processed[0]; {
	case process.Parent().SpanID() != span.SpanContext().SpanID() || process.SpanContext().TraceID() != span.SpanContext().TraceID():
		t.Errorf("process span's parent %v, want %v", process.Parent(), span.SpanContext())
	case inHandler.SpanID() != process.SpanContext().SpanID():
		t.Errorf("the handler's ctx holds span %s, want the process span %s", inHandler.SpanID(), process.SpanContext().SpanID())
	}
}
