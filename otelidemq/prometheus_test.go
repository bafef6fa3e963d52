package otelidemq_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/transports/webhook"
)

// prometheusTelemetry returns a Telemetry whose metrics a Prometheus
// registry gathers, names translated as the binary pins them.
func prometheusTelemetry(t *testing.T) (*prometheus.Registry, *otelidemq.Telemetry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes))
	if err != nil {
		t.Fatal(err)
	}
	tel, err := otelidemq.New(otelidemq.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))})
	if err != nil {
		t.Fatal(err)
	}
	return reg, tel
}

// The names a Prometheus scrape shows, through the OTel exporter with the
// translation strategy pinned as dashboards need: one event into every
// hook, then the families of the registry. The package doc lists them.
func TestPrometheusNames(t *testing.T) {
	reg, tel := prometheusTelemetry(t)

	ch := tel.ConsumerHooks(consumer.Hooks{})
	ch.OnResult(consumer.ResultEvent{Scope: "billing", Result: consumer.Result{Outcome: consumer.Applied, Duration: time.Millisecond}})
	ch.OnRetried(consumer.RetriedEvent{Scope: "billing"})
	m := relay.Message{Message: outbox.Message{Destination: "orders"}}
	rh := tel.RelayHooks(relay.Hooks{})
	rh.OnPublished(relay.PublishedEvent{Messages: []relay.Message{m}, Took: time.Millisecond})
	rh.OnFailed(relay.FailedEvent{Message: m})
	rh.OnRetried(relay.RetriedEvent{Message: m})
	rh.OnHeld(relay.HeldEvent{Message: m, Err: relay.ErrNoRoute})
	rh.OnSkipped(relay.SkippedEvent{Message: m})
	rh.OnDeadLettered(relay.DeadLetteredEvent{Message: m})
	rh.OnBacklog(relay.BacklogEvent{Stats: outbox.Stats{Pending: 3, OldestPending: time.Second, Dead: 1}})
	tel.HTTPHooks(idemhttp.Hooks{}).OnResult(idemhttp.ResultEvent{Result: request.ResultReplayed})
	tel.GRPCHooks(idemgrpc.ServerHooks{}).OnResult(idemgrpc.ResultEvent{Result: request.ResultReplayed})
	wh := tel.WebhookHooks(webhook.Hooks{})
	wh.OnDelivered(webhook.DeliveredEvent{Endpoint: "ep", Status: 204})
	wh.OnFailed(webhook.FailedEvent{Endpoint: "ep", Err: &webhook.DeliveryError{Endpoint: "ep", Err: errors.New("refused")}})
	wh.OnDisabled(webhook.DisabledEvent{Endpoint: "ep"})

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		got = append(got, f.GetName())
	}
	want := []string{
		"idemq_consumer_messages_total",
		"idemq_consumer_retries_total",
		"idemq_outbox_dead_letters",
		"idemq_outbox_oldest_pending_age_seconds",
		"idemq_outbox_pending",
		"idemq_outbox_unrouted",
		"idemq_relay_dead_letters_total",
		"idemq_relay_failures_total",
		"idemq_relay_held_total",
		"idemq_relay_retries_total",
		"idemq_relay_skipped_total",
		"idemq_request_results_total",
		"idemq_webhook_deliveries_total",
		"idemq_webhook_delivery_duration_seconds",
		"idemq_webhook_disabled_total",
		"messaging_client_operation_duration_seconds",
		"messaging_client_sent_messages_total",
		"messaging_process_duration_seconds",
	}
	got = slices.DeleteFunc(got, func(n string) bool { return n == "target_info" })
	if !slices.Equal(got, want) {
		t.Errorf("families\n got %q\nwant %q", got, want)
	}
}
