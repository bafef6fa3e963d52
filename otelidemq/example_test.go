package otelidemq_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/testenv"
)

// A consumer reports its outcomes as OpenTelemetry metrics and runs its
// handler in a span continuing the producer's trace. The application
// owns the SDK: here a ManualReader stands for a Prometheus or OTLP
// exporter.
func Example() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "otelidemq_example") // or your pgxpool.Pool
	if err != nil {
		panic(err)
	}
	defer done()

	// Once per process: W3C trace context in message headers, and the
	// providers of the SDK.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	reader := sdkmetric.NewManualReader()
	tel, err := otelidemq.New(otelidemq.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		panic(err)
	}

	handler := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error { return nil }
	c, err := consumer.New(pool, "billing", tel.Handler("kafka", "orders", handler),
		consumer.Config{Hooks: tel.ConsumerHooks(consumer.Hooks{})})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil {
		panic(err)
	}
	msg := &consumer.Message{ID: "order-1", Payload: []byte("42")}
	c.Process(ctx, msg)
	c.Process(ctx, msg) // a redelivery

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "idemq.consumer.messages" {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			outcome, _ := p.Attributes.Value("idemq.outcome")
			fmt.Printf("%s %s: %d\n", m.Name, outcome.String(), p.Value)
		}
	}
	// Unordered output:
	// idemq.consumer.messages applied: 1
	// idemq.consumer.messages duplicate: 1
}
