package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkPages10M renders each page of the console on a 10,000,000-row
// outbox backlog with 1,000,000 dead letters (184 groups), both inserted
// with generate_series and analyzed/vacuumed, and reports each page's p95
// in milliseconds (target: < 200).
func BenchmarkPages10M(b *testing.B) {
	ctx := context.Background()
	pool := testenv.Postgres(b)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	for _, sql := range []string{
		`INSERT INTO idemq_outbox (id, destination, key, payload)
SELECT gen_random_uuid(), 'dest-' || (i % 8), CASE WHEN i % 50 = 0 THEN NULL ELSE 'k' || (i % 100000) END, '\x7b7d'
FROM generate_series(1, 10000000) AS i`,
		`INSERT INTO idemq_outbox_dead (seq, id, created_at, failed_at, attempts, destination, payload, key, last_error, error_class)
SELECT 20000000 + i, gen_random_uuid(), now() - interval '1 day', now() - (i % 86400) * interval '1 second', 5,
       'dest-' || (i % 8), '\x7b7d', 'k' || (i % 50000), 'error ' || (i % 23) || ' on ' || i, 'error <n> on <n> #' || (i % 23)
FROM generate_series(1, 1000000) AS i`,
		`VACUUM ANALYZE idemq_outbox_dead`,
		`ANALYZE idemq_outbox`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
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
