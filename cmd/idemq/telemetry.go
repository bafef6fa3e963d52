package main

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/outbox"
)

// telemetry is the OpenTelemetry SDK the binary wires for otelidemq, which
// owns the metric names and the spans:
//   - metrics go to Prometheus (a client_golang registry with the Go and
//     process collectors, served on /metrics) and, when
//     OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is
//     set, to OTLP over HTTP;
//   - spans go to OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, and nowhere otherwise
//     (the trace context is still propagated in the message headers);
//   - the propagator is W3C trace context and baggage.
//
// The providers and the propagator are also the global ones, so what the
// library reports through them lands here too.
type telemetry struct {
	*otelidemq.Telemetry
	registry *prometheus.Registry
	meters   *sdkmetric.MeterProvider
	tracers  *sdktrace.TracerProvider
}

// durationBuckets are the histogram boundaries, in seconds, of the
// durations otelidemq records: the SDK's default ones suit milliseconds.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

func newTelemetry(ctx context.Context) (*telemetry, error) {
	// service.name defaults to idemq; OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override it.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "idemq")), resource.WithFromEnv())
	if err != nil {
		return nil, usageError("OpenTelemetry resource: %v", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The translation strategy is pinned: the exporter's default is to
	// change, and dashboards depend on the names.
	prom, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		return nil, err
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom),
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: durationBuckets}}))}
	if otlpSet("METRICS") {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, usageError("OTLP metric exporter: %v", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if otlpSet("TRACES") {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, usageError("OTLP trace exporter: %v", err)
		}
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	t := &telemetry{registry: reg, meters: sdkmetric.NewMeterProvider(mopts...), tracers: sdktrace.NewTracerProvider(topts...)}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	otel.SetMeterProvider(t.meters)
	otel.SetTracerProvider(t.tracers)
	otel.SetTextMapPropagator(prop)
	t.Telemetry, err = otelidemq.New(otelidemq.Config{MeterProvider: t.meters, TracerProvider: t.tracers, Propagator: prop})
	if err != nil {
		return nil, errors.Join(err, t.shutdown())
	}
	return t, nil
}

// outboxTelemetry is newTelemetry that also reports ob's backlog gauges
// (depth, oldest due, held, partitions, relays), read from index edges at
// each scrape.
func outboxTelemetry(ctx context.Context, ob *outbox.Outbox) (*telemetry, error) {
	t, err := newTelemetry(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := t.ObserveOutbox(ob); err != nil {
		return nil, errors.Join(err, t.shutdown())
	}
	return t, nil
}

// otlpSet reports whether an OTLP endpoint is configured for signal
// (METRICS, TRACES), in the exporters' own variables.
func otlpSet(signal string) bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
}

// shutdown flushes the OTLP exporters, if any.
func (t *telemetry) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(t.tracers.Shutdown(ctx), t.meters.Shutdown(ctx))
}
