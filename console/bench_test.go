package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/benchseed"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkPages10M renders each page of the console on a 10,000,000-row
// outbox backlog with 1,000,000 dead letters and an inbox with 1,000,000
// dead letters (each 184 groups of realistic error texts: 80 to 190-byte
// classes, the texts of internal/errclass's corpus), inserted with
// generate_series and analyzed/vacuumed, and reports each page's p95 in
// milliseconds (target: < 200). As a baseline measured in the same run it
// reports the p95 of grouping the outbox's dead letters from their index
// (what the dead-letters page read before migration 0006's summary) and
// the dead-letters page's ratio to it.
func BenchmarkPages10M(b *testing.B) {
	ctx, pool := context.Background(), testenv.Postgres(b)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := benchseed.Backlog(ctx, pool, 10_000_000); err != nil {
		b.Fatal(err)
	}
	if err := benchseed.DeadLetters(ctx, pool, 1_000_000); err != nil {
		b.Fatal(err)
	}
	ib, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := ib.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := benchseed.InboxDeadLetters(ctx, pool, 1_000_000); err != nil {
		b.Fatal(err)
	}
	h, err := console.NewHandler(console.Config{DB: pool, Outbox: ob, Inbox: ib})
	if err != nil {
		b.Fatal(err)
	}
	groups, err := ob.DeadGroups(ctx, outbox.DeadFilter{Limit: 1})
	if err != nil || len(groups) != 1 {
		b.Fatalf("groups %v, %v", groups, err)
	}
	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"dead", "/dead"},
		{"group", "/dead?group=" + groups[0].ID},
		{"message", "/dead/" + groups[0].SampleID.String()},
		{"inbox", "/inbox"},
		{"lookup", "/lookup?key=k42"},
		{"audit", "/audit"},
	}
	took := make([][]time.Duration, len(pages))
	var index []time.Duration
	scan := outbox.DeadFilter{FailedBefore: time.Now().Add(time.Hour)} // not a whole-group filter: read from the index
	b.ResetTimer()
	for b.Loop() {
		for i, p := range pages {
			start := time.Now()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p.path, nil))
			if rec.Code != http.StatusOK {
				b.Fatalf("GET %s: %d %s", p.path, rec.Code, rec.Body)
			}
			took[i] = append(took[i], time.Since(start))
		}
		start := time.Now()
		if _, err := ob.DeadGroups(ctx, scan); err != nil {
			b.Fatal(err)
		}
		index = append(index, time.Since(start))
	}
	for i, p := range pages {
		b.ReportMetric(p95(took[i]), p.name+"_p95_ms")
	}
	b.ReportMetric(p95(index), "index_grouping_p95_ms")
	b.ReportMetric(p95(took[1])/p95(index), "dead/index_grouping")
	b.ReportMetric(0, "ns/op")
}

// p95 is the 95th percentile of ds in milliseconds.
func p95(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[(len(s)*95+99)/100-1]) / float64(time.Millisecond)
}
