package relay_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkRelayLongTransaction drains a 5,000,000-row keyed backlog
// (1,000 keys) into a no-op Sink, counting what it publishes every second:
// for 5 s, then for 10 s while a transaction that holds an xid stays open
// on another connection, so vacuum can remove none of the rows deleted
// meanwhile. ratio = mean rate during / mean rate before; slowest_msgs/s
// is the slowest second during the transaction (0: a second without
// progress).
func BenchmarkRelayLongTransaction(b *testing.B) {
	const n = 5_000_000
	bd := setup(b)
	for range b.N {
		fill(b, bd, n, 1000)
		var published atomic.Int64
		r := newRelay(b, bd, noop, relay.Config{BatchSize: 500, DisableListen: true, Logger: quiet, Hooks: relay.Hooks{
			OnPublished: func(e relay.PublishedEvent) { published.Add(int64(len(e.Messages))) },
		}})
		ctx, cancel := context.WithCancel(bd.ctx)
		var wg sync.WaitGroup
		wg.Go(func() { _ = r.Run(ctx) })
		perSecond := func(seconds int) []float64 {
			rates := make([]float64, seconds)
			last := published.Load()
			for i := range rates {
				time.Sleep(time.Second)
				now := published.Load()
				rates[i], last = float64(now-last), now
			}
			return rates
		}
		before := perSecond(5)[1:] // the first second starts the relay
		conn, err := pgx.Connect(bd.ctx, testenv.PostgresURL(b))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(bd.ctx, `BEGIN; SELECT pg_current_xact_id()`); err != nil {
			b.Fatal(err)
		}
		during := perSecond(10)
		if err := conn.Close(bd.ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		wg.Wait()
		if left := published.Load(); left >= n {
			b.Fatalf("the backlog ran out (%d published): make it larger", left)
		}
		b.Logf("msgs/s per second: before %.0f, during %.0f", before, during)
		mb, md := mean(before), mean(during)
		b.ReportMetric(mb, "before_msgs/s")
		b.ReportMetric(md, "during_msgs/s")
		b.ReportMetric(slices.Min(during), "slowest_msgs/s")
		b.ReportMetric(md/mb, "ratio")
		b.ReportMetric(0, "ns/op")
		if _, err := bd.pool.Exec(bd.ctx, `TRUNCATE `+bd.table()); err != nil {
			b.Fatal(err)
		}
	}
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}
