package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/internal/benchseed"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkPages10M renders each page of the console on a 10,000,000-row
// outbox backlog with 1,000,000 dead letters (184 groups), both inserted
// with generate_series and analyzed/vacuumed, and reports each page's p95
// in milliseconds (target: < 200).
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
	h, err := console.NewHandler(console.Config{DB: pool, Outbox: ob})
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
		{"lookup", "/lookup?key=k42"},
		{"audit", "/audit"},
	}
	took := make([][]time.Duration, len(pages))
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
	}
	for i, p := range pages {
		s := slices.Clone(took[i])
		slices.Sort(s)
		b.ReportMetric(float64(s[(len(s)*95+99)/100-1])/float64(time.Millisecond), p.name+"_p95_ms")
	}
	b.ReportMetric(0, "ns/op")
}
