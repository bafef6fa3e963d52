package otelidemq_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemq/idemq/otelidemq"
)

// The outbox stores the trace context of the business transaction in each
// message it writes when its Config carries OutboxHeaders:
//
//	ob, err := outbox.New(pool, outbox.Config{Headers: otelidemq.OutboxHeaders(prop)})
//
// Here the enricher is called by hand, as EnqueueTx calls it.
func ExampleOutboxHeaders() {
	enrich := otelidemq.OutboxHeaders(propagation.TraceContext{})

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))
	h := map[string]string{}
	enrich(ctx, h)
	fmt.Println(h["traceparent"])
	// Output: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}
