package otelidemq_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// metrics is one collection of a ManualReader, by instrument name.
type metrics map[string]metricdata.Aggregation

func collect(t *testing.T, r *sdkmetric.ManualReader) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	m := metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, x := range sm.Metrics {
			m[x.Name] = x.Data
		}
	}
	return m
}

func (m metrics) has(name string) bool { _, ok := m[name]; return ok }

// matches reports whether set holds every attribute of want.
func matches(set attribute.Set, want map[string]string) bool {
	for k, v := range want {
		if got, ok := set.Value(attribute.Key(k)); !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum adds the counter's points whose attributes include want.
func (m metrics) sum(name string, want map[string]string) int64 {
	s, _ := m[name].(metricdata.Sum[int64])
	var n int64
	for _, p := range s.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Value
		}
	}
	return n
}

// count adds the histogram's counts whose attributes include want.
func (m metrics) count(name string, want map[string]string) uint64 {
	h, _ := m[name].(metricdata.Histogram[float64])
	var n uint64
	for _, p := range h.DataPoints {
		if matches(p.Attributes, want) {
			n += p.Count
		}
	}
	return n
}

// fixture is a Telemetry on SDK providers that keep what they record.
type fixture struct {
	*otelidemq.Telemetry
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newTelemetry(t *testing.T) fixture {
	f := fixture{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	tel, err := otelidemq.New(otelidemq.Config{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader)),
		TracerProvider: f.tp,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.Telemetry = tel
	return f
}

// ended returns the ended spans named name.
func (f fixture) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range f.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// A consumer on Postgres applies a message after one failed attempt, drops
// its redelivery, reports a conflict for its key reused with another
// payload and dead-letters a message its handler refuses: each outcome,
// the retry and the durations are counted.
func TestConsumerMetrics(t *testing.T) {
	ctx := t.Context()
	tel := newTelemetry(t)
	pool := testenv.Postgres(t)
	var calls atomic.Int32
	c, err := consumer.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		switch {
		case string(msg.Payload) == "refused":
			return idemq.Permanent(errors.New("refused"))
		case calls.Add(1) == 1:
			return errors.New("first attempt fails")
		}
		return nil
	}, consumer.Config{
		Retry:  idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Hooks:  tel.ConsumerHooks(consumer.Hooks{}),
		Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		msg  consumer.Message
		want consumer.Outcome
	}{
		{consumer.Message{ID: "m-1", Payload: []byte("a")}, consumer.Applied},
		{consumer.Message{ID: "m-1", Payload: []byte("a")}, consumer.Duplicate},
		{consumer.Message{ID: "m-1", Payload: []byte("b")}, consumer.Conflict},
		{consumer.Message{ID: "m-2", Payload: []byte("refused")}, consumer.DeadLettered},
	} {
		if r := c.Process(ctx, &step.msg); r.Outcome != step.want {
			t.Fatalf("step %d: %v (%v), want %v", i, r.Outcome, r.Err, step.want)
		}
	}

	m := collect(t, tel.reader)
	for outcome, want := range map[string]int64{"applied": 1, "duplicate": 1, "conflict": 1, "dead-lettered": 1, "retry": 0} {
		attrs := map[string]string{"idemq.scope": "billing", "idemq.outcome": outcome}
		if got := m.sum("idemq.consumer.messages", attrs); got != want {
			t.Errorf("idemq.consumer.messages{%s} = %d, want %d", outcome, got, want)
		}
		if got := m.count("messaging.process.duration", attrs); got != uint64(want) {
			t.Errorf("messaging.process.duration{%s} count = %d, want %d", outcome, got, want)
		}
	}
	if got := m.sum("idemq.consumer.retries", map[string]string{"idemq.scope": "billing"}); got != 1 {
		t.Errorf("idemq.consumer.retries = %d, want 1", got)
	}
}

// A relay on Postgres publishes to a Sink that fails one destination once
// and refuses another: published, failed, retried and dead-lettered
// messages are counted by destination, and the backlog gauges end with
// nothing pending and one dead letter. Each publish of the flaky message
// has its send span, both children of the enqueuing span.
func TestRelayMetrics(t *testing.T) {
	useTraceContext(t)
	tel := newTelemetry(t)
	ctx, enqueued := tel.tp.Tracer("test").Start(t.Context(), "enqueue")
	enqueued.End()
	pool := testenv.Postgres(t)
	ob := newOutbox(t, pool)
	var flaky atomic.Int32
	sink := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		failed := map[int]error{}
		for i, m := range batch {
			switch {
			case m.Destination == "bad":
				failed[i] = idemq.Permanent(errors.New("no such topic"))
			case m.Destination == "flaky" && flaky.Add(1) == 1:
				failed[i] = errors.New("broker busy")
			}
		}
		if len(failed) > 0 {
			return &relay.PublishError{Failed: failed}
		}
		return nil
	})
	var published atomic.Int32
	settled := make(chan struct{})
	done := func() {
		if published.Load() == 2 {
			close(settled)
		}
	}
	var dead atomic.Bool
	drained := make(chan struct{}, 1)
	r, err := relay.New(pool, ob, tel.Sink("test", sink), relay.Config{
		Logger:        quiet,
		StatsInterval: 10 * time.Millisecond,
		Retry:         idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Hooks: tel.RelayHooks(relay.Hooks{
			OnPublished: func(e relay.PublishedEvent) {
				published.Add(int32(len(e.Messages)))
				if dead.Load() {
					done()
				}
			},
			OnDeadLettered: func(relay.DeadLetteredEvent) { dead.Store(true); done() },
			OnBacklog: func(e relay.BacklogEvent) {
				if e.Stats.Pending == 0 && e.Stats.Dead == 1 {
					select {
					case drained <- struct{}{}:
					default:
					}
				}
			},
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Enqueue(ctx,
		outbox.Message{Destination: "ok", Key: "k1"},
		outbox.Message{Destination: "flaky", Key: "k2"},
		outbox.Message{Destination: "bad", Key: "k3"},
	); err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	<-settled
	<-drained
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}

	sends := tel.ended("send flaky")
	if len(sends) != 2 {
		t.Fatalf("%d send spans for the flaky message, want 2", len(sends))
	}
	for i, s := range sends {
		if s.Parent().SpanID() != enqueued.SpanContext().SpanID() {
			t.Errorf("send %d: parent %s, want the enqueuing span", i+1, s.Parent().SpanID())
		}
		attrs := attribute.NewSet(s.Attributes()...)
		if got, _ := attrs.Value("idemq.relay.attempt"); got.AsInt64() != int64(i+1) {
			t.Errorf("send %d: idemq.relay.attempt %d", i+1, got.AsInt64())
		}
		if failed := s.Status().Code == otelcodes.Error; failed != (i == 0) {
			t.Errorf("send %d: status %v", i+1, s.Status())
		}
	}

	m := collect(t, tel.reader)
	dest := func(d string) map[string]string { return map[string]string{"messaging.destination.name": d} }
	for _, c := range []struct {
		name, dest string
		want       int64
	}{
		{"messaging.client.sent.messages", "ok", 1},
		{"messaging.client.sent.messages", "flaky", 1},
		{"messaging.client.sent.messages", "bad", 0},
		{"idemq.relay.failures", "flaky", 1},
		{"idemq.relay.failures", "bad", 1},
		{"idemq.relay.retries", "flaky", 1},
		{"idemq.relay.retries", "bad", 0},
		{"idemq.relay.dead_letters", "bad", 1},
		{"idemq.relay.dead_letters", "flaky", 0},
	} {
		if got := m.sum(c.name, dest(c.dest)); got != c.want {
			t.Errorf("%s{%s} = %d, want %d", c.name, c.dest, got, c.want)
		}
	}
	if m.count("messaging.client.operation.duration", map[string]string{"messaging.operation.name": "send"}) == 0 {
		t.Error("no messaging.client.operation.duration recorded")
	}
	for name, want := range map[string]int64{"idemq.outbox.pending": 0, "idemq.outbox.dead_letters": 1} {
		if g, ok := m[name].(metricdata.Gauge[int64]); !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != want {
			t.Errorf("%s = %+v, want %d", name, m[name], want)
		}
	}
	if g, ok := m["idemq.outbox.oldest_pending.age"].(metricdata.Gauge[float64]); !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 0 {
		t.Errorf("idemq.outbox.oldest_pending.age = %+v, want 0", m["idemq.outbox.oldest_pending.age"])
	}
}

// The HTTP middleware on a Postgres store: a request, its retry, the key
// reused for another body and a request whose store is down are counted
// by result; so is a gRPC call.
func TestRequestMetrics(t *testing.T) {
	ctx := t.Context()
	tel := newTelemetry(t)
	pool := testenv.Postgres(t)
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	downPool := testenv.Postgres(t)
	down, err := pgstore.New(downPool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	downPool.Close()
	created := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	serve := func(s request.Store) string {
		m, err := idemhttp.New(s, idemhttp.Config{Hooks: tel.HTTPHooks(idemhttp.Hooks{})})
		if err != nil {
			t.Fatal(err)
		}
		protected := m.Wrap(created)
		// A server span around the middleware, as otelhttp makes one.
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, span := tel.tp.Tracer("test").Start(r.Context(), "POST /orders")
			defer span.End()
			protected.ServeHTTP(w, r.WithContext(ctx))
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	up, broken := serve(store), serve(down)
	for i, c := range []struct {
		url, body string
		want      int
	}{
		{up, "a", http.StatusCreated},
		{up, "a", http.StatusCreated},                // replayed
		{up, "b", http.StatusUnprocessableEntity},    // key reused
		{broken, "a", http.StatusServiceUnavailable}, // store down
	} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(c.body))
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, c.want)
		}
	}
	tel.GRPCHooks(idemgrpc.ServerHooks{}).OnResult(idemgrpc.ResultEvent{Result: request.ResultInFlight, Code: codes.Aborted})

	var results []string
	for _, s := range tel.ended("POST /orders") {
		for _, a := range s.Attributes() {
			if a.Key == "idemq.result" {
				results = append(results, a.Value.AsString())
			}
		}
	}
	if want := []string{"completed", "replayed", "conflict", "unavailable"}; !slices.Equal(results, want) {
		t.Errorf("idemq.result on the request spans: %v, want %v", results, want)
	}

	m := collect(t, tel.reader)
	for _, c := range []struct{ transport, result string }{
		{"http", "completed"}, {"http", "replayed"}, {"http", "conflict"}, {"http", "unavailable"}, {"grpc", "in_flight"},
	} {
		if got := m.sum("idemq.request.results", map[string]string{"idemq.transport": c.transport, "idemq.result": c.result}); got != 1 {
			t.Errorf("idemq.request.results{%s, %s} = %d, want 1", c.transport, c.result, got)
		}
	}
}

// The webhook Sink, wrapped for traces and with metric hooks, delivers to
// an endpoint that answers 204 and to one that answers 503: deliveries are
// counted by endpoint and class, and the delivered request carries the
// send span's trace context in the publisher's trace.
func TestWebhookMetricsAndTraceHeaders(t *testing.T) {
	useTraceContext(t)
	ctx := t.Context()
	tel := newTelemetry(t)
	pool := testenv.Postgres(t)
	reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	traceparent := make(chan string, 1)
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		traceparent <- r.Header.Get("traceparent")
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(ok.Close)
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(busy.Close)
	for id, url := range map[string]string{"ok": ok.URL, "busy": busy.URL} {
		if _, err := reg.Add(ctx, endpoints.Endpoint{ID: id, URL: url, Keys: []string{signing.NewSecret()}}); err != nil {
			t.Fatal(err)
		}
	}
	sink, err := webhook.NewSink(reg, webhook.Config{
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger:          quiet,
		Hooks:           tel.WebhookHooks(webhook.Hooks{}),
	})
	if err != nil {
		t.Fatal(err)
	}

	// The context enqueue would have stored.
	pubCtx, pub := tel.tp.Tracer("test").Start(ctx, "publish invoice.paid")
	pub.End()
	stored := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(pubCtx, stored)
	headers := map[string]string{"content-type": "application/json", "traceparent": stored["traceparent"]}
	var batch []relay.Message
	for _, id := range []string{"ok", "busy"} {
		batch = append(batch, relay.Message{Message: outbox.Message{
			ID: uuid.Must(uuid.NewV7()), Destination: endpoints.DestinationPrefix + id,
			Payload: []byte(`{"type":"invoice.paid","timestamp":"2026-11-23T18:00:00Z","data":{}}`),
			Headers: headers, // shared, as the relay's copies may share it
		}})
	}
	err = tel.Sink("webhook", sink).Publish(ctx, 0, batch)
	var pe *relay.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 1 || pe.Failed[1] == nil {
		t.Fatalf("Publish: %v, want the busy endpoint failed", err)
	}
	if headers["traceparent"] != stored["traceparent"] {
		t.Error("the shared header map was changed")
	}

	got := propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": <-traceparent})
	sent, failed := tel.ended("send "+endpoints.DestinationPrefix+"ok"), tel.ended("send "+endpoints.DestinationPrefix+"busy")
	if len(sent) != 1 || len(failed) != 1 {
		t.Fatalf("%d and %d send spans, want 1 each", len(sent), len(failed))
	}
	if failed[0].Status().Code != otelcodes.Error {
		t.Errorf("the failed delivery's span has status %v", failed[0].Status())
	}
	switch sc, send := trace.SpanContextFromContext(got), sent[0]; {
	case sc.TraceID() != pub.SpanContext().TraceID():
		t.Errorf("delivered trace %s, want the publisher's %s", sc.TraceID(), pub.SpanContext().TraceID())
	case sc.SpanID() != send.SpanContext().SpanID():
		t.Errorf("delivered span %s, want the send span %s", sc.SpanID(), send.SpanContext().SpanID())
	}

	m := collect(t, tel.reader)
	for _, c := range []struct{ endpoint, class string }{{"ok", "2xx"}, {"busy", "5xx"}} {
		attrs := map[string]string{"idemq.webhook.endpoint": c.endpoint, "idemq.webhook.class": c.class}
		if got := m.sum("idemq.webhook.deliveries", attrs); got != 1 {
			t.Errorf("idemq.webhook.deliveries{%s, %s} = %d, want 1", c.endpoint, c.class, got)
		}
		if got := m.count("idemq.webhook.delivery.duration", attrs); got != 1 {
			t.Errorf("idemq.webhook.delivery.duration{%s, %s} count = %d, want 1", c.endpoint, c.class, got)
		}
	}
}
