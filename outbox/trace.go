package outbox

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// withTraceContext stores the trace context of ctx (W3C traceparent and
// tracestate through the global propagator, otel.SetTextMapPropagator) in
// the headers of each message, so the relay and the consumers downstream
// continue the business transaction's trace. A message that already
// carries a header the propagator writes keeps its own: a creation context
// set by the caller is not replaced. The caller's messages and header maps
// are not modified; msgs is returned unchanged when ctx carries nothing.
func withTraceContext(ctx context.Context, msgs []Message) []Message {
	trace := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, trace)
	if len(trace) == 0 {
		return msgs
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		h := make(map[string]string, len(m.Headers)+len(trace))
		maps.Copy(h, trace)
		maps.Copy(h, m.Headers)
		m.Headers = h
		out[i] = m
	}
	return out
}
