package relay_test

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/relay"
)

// envInt reads a benchmark size from the environment.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkFleetDrain drains N databases of M keyed rows each (100 keys)
// with one fleet process at its default budget (20 connections, so 4
// databases at a time), against one relay draining the same N x M rows
// from a single database, alternated in the same run; ratio = fleet /
// single. IDEMQ_FLEET_DATABASES (default 20) and IDEMQ_FLEET_ROWS (default
// 2,000) set N and M; the figure is 200 x 10,000.
func BenchmarkFleetDrain(b *testing.B) {
	n, m := envInt("IDEMQ_FLEET_DATABASES", 20), envInt("IDEMQ_FLEET_ROWS", 2000)
	dbs := fleetDatabases(b, n, "fleet-bench")
	single := fleetDatabases(b, 1, "fleet-bench-single")[0]
	var fleetRates, singleRates []float64
	for range b.N * 3 {
		for _, d := range dbs {
			enqueueTenant(b, d, m, 100)
		}
		enqueueTenant(b, single, n*m, 100)
		singleRates = append(singleRates, drainWith(b, n*m, func(sink relay.Sink) func(context.Context) error {
			r, err := relay.New(fleetOutboxPool(b, single), fleetOutbox(b, single), sink, relay.Config{Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			return r.Run
		}))
		fleetRates = append(fleetRates, drainWith(b, n*m, func(sink relay.Sink) func(context.Context) error {
			f, err := relay.NewFleet(fleet.Static(dbs...), sink, relay.FleetConfig{Relay: relay.Config{Logger: quiet}, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			return f.Run
		}))
	}
	fm, sm := median(fleetRates), median(singleRates)
	b.ReportMetric(fm, "msgs/s")
	b.ReportMetric(sm, "single_msgs/s")
	b.ReportMetric(fm/sm, "ratio")
	b.ReportMetric(0, "ns/op")
}

// drainWith runs what run returns with a counting Sink until total
// messages were published, and returns messages per second.
func drainWith(b *testing.B, total int, run func(relay.Sink) func(context.Context) error) float64 {
	b.Helper()
	var published atomic.Int64
	done := make(chan struct{})
	sink := relay.SinkFunc(func(_ context.Context, batch []relay.Message) error {
		if published.Add(int64(len(batch))) == int64(total) {
			close(done)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	ended := make(chan error, 1)
	go func() { ended <- run(sink)(ctx) }()
	select {
	case <-done:
	case err := <-ended:
		cancel()
		b.Fatalf("stopped after %d of %d messages: %v", published.Load(), total, err)
	case <-time.After(10 * time.Minute):
		cancel()
		b.Fatalf("%d of %d messages published in 10 minutes", published.Load(), total)
	}
	elapsed := time.Since(start)
	cancel()
	<-ended
	return float64(total) / elapsed.Seconds()
}
