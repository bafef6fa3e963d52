package relay_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/outbox"
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
	sink := relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
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

// BenchmarkFleetFairness measures the commit-to-publish latency of a
// trickle of messages into 9 databases (one every 50 ms, in turn) while a
// tenth database holds a backlog of IDEMQ_FLEET_BACKLOG rows (default
// 100,000), against the same trickle without the backlog, in the same
// run; ratio = p99 with the backlog / p99 without (target <= 1.5). The
// fleet runs at its defaults: 20 connections, 4 databases at a time.
func BenchmarkFleetFairness(b *testing.B) {
	backlog := envInt("IDEMQ_FLEET_BACKLOG", 100_000)
	dbs := fleetDatabases(b, 10, "fleet-fair")
	trickle := func(withBacklog bool) time.Duration {
		if withBacklog {
			enqueueTenant(b, dbs[0], backlog, 1000)
		}
		var mu sync.Mutex
		var lat []time.Duration
		sink := relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for _, m := range batch {
				if sent, err := strconv.ParseInt(string(m.Payload), 10, 64); err == nil {
					lat = append(lat, now.Sub(time.Unix(0, sent)))
				}
			}
			return nil
		})
		f, err := relay.NewFleet(fleet.Static(dbs...), sink, relay.FleetConfig{Relay: relay.Config{Logger: quiet}, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan error, 1)
		go func() { ended <- f.Run(ctx) }()
		obs := make([]*outbox.Outbox, 9)
		for i := range obs {
			obs[i] = fleetOutbox(b, dbs[i+1])
		}
		const n = 200
		for i := range n {
			msg := outbox.Message{Destination: "trickle", Key: "k", Payload: strconv.AppendInt(nil, time.Now().UnixNano(), 10)}
			if err := obs[i%9].Enqueue(ctx, msg); err != nil {
				b.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		deadline := time.After(2 * time.Minute)
		for {
			mu.Lock()
			got := len(lat)
			mu.Unlock()
			if got >= n {
				break
			}
			select {
			case <-deadline:
				b.Fatalf("%d of %d trickle messages published in 2 minutes", got, n)
			case <-time.After(50 * time.Millisecond):
			}
		}
		cancel()
		<-ended
		if withBacklog { // what is left of the backlog goes before the next round
			if _, err := fleetOutboxPool(b, dbs[0]).Exec(context.Background(), `TRUNCATE idemq_outbox`); err != nil {
				b.Fatal(err)
			}
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100]
	}
	var without, with []float64
	for range b.N * 2 {
		without = append(without, float64(trickle(false)))
		with = append(with, float64(trickle(true)))
	}
	w, wo := median(with), median(without)
	b.ReportMetric(wo/1e6, "p99_ms")
	b.ReportMetric(w/1e6, "p99_backlog_ms")
	b.ReportMetric(w/wo, "ratio")
	b.ReportMetric(0, "ns/op")
}
