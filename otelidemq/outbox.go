package otelidemq

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// OutboxHeaders returns the header enricher of outbox.Config.Headers that
// stores the trace context of each EnqueueTx call's ctx (with W3C trace
// context: traceparent, tracestate) in the messages it writes, so that
// [Telemetry.Sink] continues the business transaction's trace at the relay
// and [Telemetry.Handler] in each consumer. Pass the propagator of
// Config.Propagator; nil means the global one (otel.GetTextMapPropagator)
// as it stands at each call.
//
//	ob, err := outbox.New(pool, outbox.Config{Headers: otelidemq.OutboxHeaders(nil)})
func OutboxHeaders(p propagation.TextMapPropagator) func(ctx context.Context, h map[string]string) {
	return func(ctx context.Context, h map[string]string) {
		prop := p
		if prop == nil {
			prop = otel.GetTextMapPropagator()
		}
		prop.Inject(ctx, propagation.MapCarrier(h))
	}
}
