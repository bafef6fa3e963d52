package otelidemq

import (
	"context"
	"errors"
	"maps"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
)

// Sink wraps s so that every message it publishes gets a "send
// <destination>" span, child of the trace context stored in the message's
// headers by outbox.EnqueueTx ([OutboxHeaders]), and carries that span's context in its
// headers downstream. system names the broker in the spans'
// messaging.system attribute ("kafka", "nats", "webhook"). When s is a
// relay.Watermarker (a transactional Kafka sink), so is the wrapper.
func (t *Telemetry) Sink(system string, s relay.Sink) relay.Sink {
	send := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
		spans := make([]trace.Span, len(batch))
		for i := range batch {
			m := &batch[i]
			parent := t.propagator.Extract(ctx, headerCarrier(m.Headers))
			parent, spans[i] = t.tracer.Start(parent, "send "+m.Destination,
				trace.WithSpanKind(trace.SpanKindProducer),
				// The semantic conventions link a send to the creation
				// context; idemq also makes it the parent, so the trace
				// runs on into the consumers.
				trace.WithLinks(trace.LinkFromContext(parent)),
				trace.WithAttributes(
					semconv.MessagingSystemKey.String(system),
					sendOperation,
					semconv.MessagingOperationTypeSend,
					semconv.MessagingDestinationName(m.Destination),
					semconv.MessagingMessageID(m.ID.String()),
					attribute.Int("idemq.relay.attempt", m.Attempts+1),
				))
			// The relay hands the Sink copies of its rows, but the
			// header map may be shared: write to a new one.
			h := make(map[string]string, len(m.Headers)+2)
			maps.Copy(h, m.Headers)
			t.propagator.Inject(parent, propagation.MapCarrier(h))
			m.Headers = h
		}
		err := s.Publish(ctx, id, batch)
		var pe *relay.PublishError
		partial := errors.As(err, &pe)
		for i, span := range spans {
			failed := err
			if partial {
				failed = pe.Failed[i]
			}
			if failed != nil {
				span.RecordError(failed)
				span.SetStatus(codes.Error, failed.Error())
			}
			span.End()
		}
		return err
	})
	if wm, ok := s.(relay.Watermarker); ok {
		return watermarkSink{send, wm}
	}
	return send
}

// watermarkSink is a traced Sink that keeps its Watermarker.
type watermarkSink struct {
	relay.SinkFunc
	relay.Watermarker
}

// Handler wraps h so that every attempt at a message runs in a "process
// <destination>" span, child of the trace context in the message's
// headers. destination names the topic or subject consumed; system the
// broker, as in [Telemetry.Sink].
func (t *Telemetry) Handler(system, destination string, h consumer.Handler) consumer.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		ctx, span := t.startProcess(ctx, system, destination, msg)
		err := h(ctx, tx, msg)
		endProcess(span, err)
		return err
	}
}

// LeasedHandler is [Telemetry.Handler] for a leased consumer.
func (t *Telemetry) LeasedHandler(system, destination string, h consumer.LeasedHandler) consumer.LeasedHandler {
	return func(ctx context.Context, msg *consumer.Message, lease idemq.Lease) error {
		ctx, span := t.startProcess(ctx, system, destination, msg)
		err := h(ctx, msg, lease)
		endProcess(span, err)
		return err
	}
}

func (t *Telemetry) startProcess(ctx context.Context, system, destination string, msg *consumer.Message) (context.Context, trace.Span) {
	ctx = t.propagator.Extract(ctx, headerCarrier(msg.Headers))
	return t.tracer.Start(ctx, "process "+destination,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(system),
			processOperation,
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(destination),
			semconv.MessagingMessageID(msg.ID),
		))
}

func endProcess(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// headerCarrier reads message headers whatever the case of their names:
// Kafka and NATS keep the lower-case names idemq writes, HTTP canonicalises
// them.
type headerCarrier map[string]string

func (c headerCarrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

// Set is never called: the carrier is only extracted from.
func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	return propagation.MapCarrier(c).Keys()
}
