package outbox_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/benchseed"
	"github.com/idemq/idemq/internal/outboxsql"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkDeadGroups1M groups 1,000,000 dead letters (23 realistic
// error classes of 80 to 190 bytes over 8 destinations: 184 groups),
// inserted with generate_series and vacuumed (as autovacuum leaves a table
// at rest), and reports the p95 of one DeadGroups call in milliseconds
// from the groups' summary (migration 0006), the p95 of the same grouping
// read from the dead letters' index (a filter the summary cannot answer:
// the baseline, measured in the same run), their ratio, and the p95 of a
// group's first page of dead letters.
func BenchmarkDeadGroups1M(b *testing.B) {
	ctx, pool, ob := benchOutbox(b)
	if err := benchseed.DeadLetters(ctx, pool, 1_000_000); err != nil {
		b.Fatal(err)
	}
	scan := outbox.DeadFilter{FailedBefore: time.Now().Add(time.Hour)}
	var groups, scans, pages []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		gs, err := ob.DeadGroups(ctx, outbox.DeadFilter{})
		if err != nil || len(gs) != 100 || gs[0].Count == 0 {
			b.Fatalf("%d groups, %v", len(gs), err)
		}
		groups = append(groups, time.Since(start))
		start = time.Now()
		if all, err := ob.DeadGroups(ctx, scan); err != nil || len(all) != 100 || all[0].Count != gs[0].Count {
			b.Fatalf("%d groups from the index, %v", len(all), err)
		}
		scans = append(scans, time.Since(start))
		start = time.Now()
		dead, err := ob.DeadLetters(ctx, gs[0].Filter())
		if err != nil || len(dead) != 100 {
			b.Fatalf("%d dead letters, %v", len(dead), err)
		}
		pages = append(pages, time.Since(start))
	}
	b.ReportMetric(p95(groups), "group_p95_ms")
	b.ReportMetric(p95(scans), "index_group_p95_ms")
	b.ReportMetric(p95(groups)/p95(scans), "summary/index")
	b.ReportMetric(p95(pages), "page_p95_ms")
	b.ReportMetric(0, "ns/op")
}

// p50 is the median of ds in milliseconds.
func p50(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}

// p95 is the 95th percentile of ds in milliseconds.
func p95(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[(len(s)*95+99)/100-1]) / float64(time.Millisecond)
}

// BenchmarkGauges10M reads the gauges of a 10,000,000-row backlog (8
// destinations, 100,000 keys over the 64 partitions and some unkeyed rows,
// inserted with generate_series and analyzed) and reports the p95 of one
// Gauges call, a metrics scrape's cost, in milliseconds (target: <= 5).
func BenchmarkGauges10M(b *testing.B) {
	ctx, pool, ob := benchOutbox(b)
	const n = 10_000_000
	if err := benchseed.Backlog(ctx, pool, n); err != nil {
		b.Fatal(err)
	}
	var took []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		g, err := ob.Gauges(ctx)
		if err != nil || g.Exact || g.Depth < n/2 || len(g.Destinations) != 8 || len(g.Partitions) != 65 {
			b.Fatalf("gauges %+v, %v", g, err)
		}
		took = append(took, time.Since(start))
	}
	b.ReportMetric(p50(took), "scrape_p50_ms")
	b.ReportMetric(p95(took), "scrape_p95_ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkGaugesStatements splits a scrape's cost among Gauges' five
// statements on a 1,000,000-row backlog: it sends the batch whole and
// without each statement in turn, interleaved, and reports each batch's
// p50 in microseconds; whole minus without-X is X's share. (At 1M rows:
// whole ≈ 420 µs, of which partitions ≈ 180, sample ≈ 100, stats ≈ 35.)
func BenchmarkGaugesStatements(b *testing.B) {
	ctx, pool, _ := benchOutbox(b)
	if err := benchseed.Backlog(ctx, pool, 1_000_000); err != nil {
		b.Fatal(err)
	}
	q, err := outboxsql.For("public", "idemq_outbox")
	if err != nil {
		b.Fatal(err)
	}
	statements := []struct {
		name, sql string
		args      []any
	}{
		{"edges", q.GaugeEdges, []any{q.Table}},
		{"sample", q.GaugeSample, []any{outboxsql.NoRoute, outbox.GaugeSample + 1}},
		{"stats", q.GaugeStats, []any{"public", "idemq_outbox"}},
		{"partitions", q.GaugePartitions, nil},
		{"relays", q.GaugeRelays, nil},
	}
	took := make([][]time.Duration, len(statements)+1) // [i]: without statement i; [len]: whole
	b.ResetTimer()
	for b.Loop() {
		for skip := range took {
			batch := &pgx.Batch{}
			for i, s := range statements {
				if i != skip {
					batch.Queue(s.sql, s.args...)
				}
			}
			start := time.Now()
			if err := pool.SendBatch(ctx, batch).Close(); err != nil {
				b.Fatal(err)
			}
			took[skip] = append(took[skip], time.Since(start))
		}
	}
	b.ReportMetric(p50(took[len(statements)])*1000, "whole_p50_us")
	for i, s := range statements {
		b.ReportMetric(p50(took[i])*1000, "without_"+s.name+"_p50_us")
	}
	b.ReportMetric(0, "ns/op")
}

// benchOutbox returns a migrated outbox with the default names in a fresh
// database, for benchseed to fill.
func benchOutbox(b *testing.B) (context.Context, *pgxpool.Pool, *outbox.Outbox) {
	b.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(b)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	return ctx, pool, ob
}
