package otelidemq_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// TestObserveOutbox: a scrape reads the outbox's gauges: depth per
// destination, held rows, the partitions; after Unregister, none.
func TestObserveOutbox(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Enqueue(ctx, outbox.Message{Destination: "orders", Key: "k", Payload: []byte("a")},
		outbox.Message{Destination: "orders", Key: "k", Payload: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	reg, tel := prometheusTelemetry(t)
	if _, err := tel.ObserveOutbox(nil); err == nil {
		t.Error("ObserveOutbox(nil) accepted")
	}
	registration, err := tel.ObserveOutbox(ob)
	if err != nil {
		t.Fatal(err)
	}
	series := scrape(t, reg)
	if got := series[`idemq_outbox_depth{idemq_exact="true",messaging_destination_name="orders"}`]; got != 2 {
		t.Errorf("depth of orders: %v, want 2; series %v", got, series)
	}
	n := 0
	for name := range series {
		for _, family := range []string{"idemq_outbox_partition_lag_seconds{", "idemq_outbox_partition_token{", "idemq_outbox_held{"} {
			if strings.HasPrefix(name, family) {
				n++
			}
		}
	}
	if n != 65*2+3 {
		t.Errorf("%d partition and held series; want %d", n, 65*2+3)
	}
	if err := registration.Unregister(); err != nil {
		t.Fatal(err)
	}
	for name := range scrape(t, reg) {
		if strings.HasPrefix(name, "idemq_outbox_depth") {
			t.Errorf("after Unregister: %s", name)
		}
	}
}

// scrape gathers reg's gauges as name{labels} -> value.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}
