package outbox_test

import (
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/benchseed"
	"github.com/idemq/idemq/outbox"
)

// BenchmarkDeadGroups1M groups 1,000,000 dead letters (23 classes over 8
// destinations: 184 groups), inserted with generate_series and vacuumed
// (as autovacuum leaves a table at rest), and reports the p95 of one DeadGroups call in
// milliseconds (target: < 1000), plus the p95 of a group's first page of
// dead letters.
func BenchmarkDeadGroups1M(b *testing.B) {
	ctx, pool, ob := benchseed.Outbox(b)
	if err := benchseed.DeadLetters(ctx, pool, 1_000_000); err != nil {
		b.Fatal(err)
	}
	var groups, pages []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		gs, err := ob.DeadGroups(ctx, outbox.DeadFilter{})
		if err != nil || len(gs) != 100 || gs[0].Count == 0 {
			b.Fatalf("%d groups, %v", len(gs), err)
		}
		groups = append(groups, time.Since(start))
		start = time.Now()
		dead, err := ob.DeadLetters(ctx, gs[0].Filter())
		if err != nil || len(dead) != 100 {
			b.Fatalf("%d dead letters, %v", len(dead), err)
		}
		pages = append(pages, time.Since(start))
	}
	b.ReportMetric(p95(groups), "group_p95_ms")
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
	ctx, pool, ob := benchseed.Outbox(b)
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
