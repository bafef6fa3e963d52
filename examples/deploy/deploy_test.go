// Package deploy_test checks the monitoring files of examples/deploy: the
// Prometheus alerting rules pass promtool's check and unit tests, and the
// rules and the Grafana dashboard name only metrics that a relay running
// with otelidemq exports.
package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemq/idemq/otelidemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
)

const (
	rules     = "prometheus/idemq-alerts.yml"
	ruleTests = "prometheus/idemq-alerts_test.yml"
	dashboard = "grafana/idemq-relay.json"
)

// promtool finds promtool, from the Debian package prometheus, which make
// test installs.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install it (apt-get install -y prometheus, or make test, which does) and run the test again")
	}
	return p
}

// TestAlertRules: promtool checks the rules and runs their unit tests,
// which fire each alert on a series that should and keep it quiet on one
// that should not.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	p := promtool(t)
	for _, args := range [][]string{{"check", "rules", rules}, {"test", "rules", ruleTests}} {
		out, err := exec.Command(p, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestMonitoringNamesExportedMetrics: every metric the rules and the
// dashboard query is one that a relay instrumented with otelidemq
// (RelayHooks, WebhookHooks, ObserveOutbox) shows in a Prometheus scrape,
// so a renamed metric cannot leave an alert that never fires.
func TestMonitoringNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	exported := scrapeRelay(t)
	queried := map[string][]string{}
	rulesText, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rulesText), "\n") {
		if expr, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			queried[rules] = append(queried[rules], expr)
		}
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	js, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboard, p.Title)
		}
		for _, q := range p.Targets {
			queried[dashboard] = append(queried[dashboard], q.Expr)
		}
	}
	name := regexp.MustCompile(`\b(?:idemq|messaging)_[a-z_]+\b`)
	for file, exprs := range queried {
		if len(exprs) == 0 {
			t.Errorf("%s: no queries found", file)
		}
		for _, expr := range exprs {
			for _, m := range name.FindAllString(expr, -1) {
				if strings.HasPrefix(m, "idemq_relay_hold_reason") || strings.HasPrefix(m, "idemq_relay_owner") || strings.HasPrefix(m, "idemq_webhook_endpoint") ||
					strings.HasPrefix(m, "idemq_webhook_class") || strings.HasPrefix(m, "messaging_destination_name") || m == "idemq_exact" {
					continue // a label
				}
				if !slices.Contains(exported, strings.TrimSuffix(m, "_bucket")) {
					t.Errorf("%s queries %s, which a relay does not export (it exports %v)", file, m, exported)
				}
			}
		}
	}
}

// scrapeRelay runs a relay instrumented with otelidemq on a fresh outbox
// until every family it exports has a series, and returns their names: a
// message published, one held for lack of a route, a failure, a retry, a
// message skipped behind it and a dead letter, the webhook hooks' events,
// and the outbox gauges.
func scrapeRelay(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
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
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	gauges, err := tel.ObserveOutbox(ob)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gauges.Unregister() }()

	router := relay.NewRouter()
	if err := router.Route("orders", relay.SinkFunc(func(context.Context, relay.BatchID, []relay.Message) error { return nil })); err != nil {
		t.Fatal(err)
	}
	if err := router.Route("refused", relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		f := relay.NewFailures(batch)
		for i := range batch {
			if !f.Skip(i) {
				f.Fail(i, errors.New("refused"))
			}
		}
		return f.Err(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	// Two attempts at the first "refused" message, which skip the second
	// of its key: a retry, then a dead letter.
	retry := relay.RetryDefault
	retry.MaxAttempts, retry.BaseDelay = 2, time.Millisecond
	r, err := relay.New(pool, ob, router, relay.Config{
		Hooks:         tel.RelayHooks(relay.Hooks{}),
		Retry:         retry,
		StatsInterval: 50 * time.Millisecond,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Enqueue(ctx,
		outbox.Message{Destination: "orders", Key: "k", Payload: []byte("{}")},
		outbox.Message{Destination: "nowhere", Key: "k2", Payload: []byte("{}")},
		outbox.Message{Destination: "refused", Key: "r", Payload: []byte("{}")},
		outbox.Message{Destination: "refused", Key: "r", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	wh := tel.WebhookHooks(webhook.Hooks{})
	wh.OnDelivered(webhook.DeliveredEvent{Endpoint: "ep", Status: 204})
	wh.OnDisabled(webhook.DisabledEvent{Endpoint: "ep"})

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	want := []string{"idemq_relay_dead_letters_total", "idemq_relay_skipped_total", "idemq_relay_held_total", "idemq_relay_liveness_remaining_seconds",
		"idemq_outbox_held", "messaging_client_sent_messages_total", "idemq_outbox_dead_letters"}
	deadline := time.Now().Add(time.Minute)
	for {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range families {
			names = append(names, f.GetName())
		}
		missing := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return slices.Contains(names, n) })
		if len(missing) == 0 {
			return names
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute the relay still exports no %v (it exports %v)", missing, names)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
