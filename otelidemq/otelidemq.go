package otelidemq

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/idemq/idemq/otelidemq"

// Config configures a [Telemetry]. The zero value uses the global
// providers.
type Config struct {
	// MeterProvider creates the instruments. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider creates the spans. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads and writes the trace context in message headers.
	// Give the outbox the same one ([OutboxHeaders]). Defaults to
	// otel.GetTextMapPropagator().
	Propagator propagation.TextMapPropagator
}

func (c Config) withDefaults() Config {
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	return c
}

// Telemetry holds the instruments and the tracer. It is safe for
// concurrent use; create one per process and share it.
type Telemetry struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	consumer   consumerInstruments
	relay      relayInstruments
	request    metric.Int64Counter
	webhook    webhookInstruments
}

// Attribute keys of the idemq.* metrics.
const (
	keyScope     = attribute.Key("idemq.scope")
	keyOutcome   = attribute.Key("idemq.outcome")
	keyTransport = attribute.Key("idemq.transport")
	keyResult    = attribute.Key("idemq.result")
	keyEndpoint  = attribute.Key("idemq.webhook.endpoint")
	keyClass     = attribute.Key("idemq.webhook.class")
	keyReason    = attribute.Key("idemq.relay.hold_reason")
)

// New creates the instruments. It fails if a provider or the propagator
// of cfg is a typed nil (such as a nil *sdkmetric.MeterProvider, which
// would panic on first use; leave the field nil for the global one), or
// if the MeterProvider refuses an instrument.
func New(cfg Config) (*Telemetry, error) {
	for _, f := range []struct {
		name string
		v    any
	}{{"MeterProvider", cfg.MeterProvider}, {"TracerProvider", cfg.TracerProvider}, {"Propagator", cfg.Propagator}} {
		if f.v != nil && nilcheck.IsNil(f.v) {
			return nil, idemq.NewConfigError("otelidemq", f.name, "is a typed nil: pass a working value, or leave it nil for the global one")
		}
	}
	cfg = cfg.withDefaults()
	m := cfg.MeterProvider.Meter(ScopeName)
	t := &Telemetry{
		tracer:     cfg.TracerProvider.Tracer(ScopeName),
		propagator: cfg.Propagator,
	}
	b := builder{m: m}
	t.consumer = consumerInstruments{
		duration: b.histogram("messaging.process.duration", "Duration of processing one message by a consumer."),
		messages: b.counter("idemq.consumer.messages", "{message}", "Messages processed by a consumer, by final outcome."),
		retries:  b.counter("idemq.consumer.retries", "{attempt}", "Failed attempts a consumer retried in process."),
	}
	t.relay = relayInstruments{
		sent:        b.counter("messaging.client.sent.messages", "{message}", "Messages the relay published."),
		duration:    b.histogram("messaging.client.operation.duration", "Duration of one publish of a batch by the relay."),
		failures:    b.counter("idemq.relay.failures", "{message}", "Failed publishes of a message (held and skipped messages not included)."),
		held:        b.counter("idemq.relay.held", "{message}", "Messages held without an attempt, by reason (no_route, sink)."),
		skipped:     b.counter("idemq.relay.skipped", "{message}", "Messages put back, not attempted, behind an earlier failed message of their key."),
		retries:     b.counter("idemq.relay.retries", "{message}", "Failed messages rescheduled for another publish."),
		deadLetters: b.counter("idemq.relay.dead_letters", "{message}", "Messages moved to the outbox's dead letters."),
		pending:     b.gauge("idemq.outbox.pending", "{message}", "Messages waiting in the outbox."),
		oldest:      b.floatGauge("idemq.outbox.oldest_pending.age", "s", "Age of the oldest message waiting in the outbox."),
		dead:        b.gauge("idemq.outbox.dead_letters", "{message}", "Dead letters in the outbox."),
		unrouted:    b.gauge("idemq.outbox.unrouted", "{message}", "Messages held in the outbox because no route matches their destination."),
	}
	t.request = b.counter("idemq.request.results", "{request}", "Requests protected by an idempotency key, by result.")
	t.webhook = webhookInstruments{
		deliveries: b.counter("idemq.webhook.deliveries", "{delivery}", "Webhook deliveries by endpoint and class of answer."),
		duration:   b.histogram("idemq.webhook.delivery.duration", "Duration of one webhook delivery."),
		disabled:   b.counter("idemq.webhook.disabled", "{endpoint}", "Webhook endpoints disabled."),
	}
	if b.err != nil {
		return nil, b.err
	}
	return t, nil
}

// builder creates instruments and keeps the first error.
type builder struct {
	m   metric.Meter
	err error
}

func (b *builder) keep(err error) {
	if b.err == nil {
		b.err = err
	}
}

func (b *builder) counter(name, unit, desc string) metric.Int64Counter {
	c, err := b.m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return c
}

func (b *builder) histogram(name, desc string) metric.Float64Histogram {
	h, err := b.m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc))
	b.keep(err)
	return h
}

func (b *builder) gauge(name, unit, desc string) metric.Int64Gauge {
	g, err := b.m.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return g
}

func (b *builder) floatGauge(name, unit, desc string) metric.Float64Gauge {
	g, err := b.m.Float64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.keep(err)
	return g
}
