package inbox_test

import (
	"context"
	"testing"

	"github.com/idemq/idemq/inbox"
)

// recordBytes fills the inbox with n records shaped as Claim writes them
// (UUID keys, SHA-256 fingerprints) and returns the bytes per record of the
// table with its primary key, and of the table with all its indexes.
func recordBytes(tb testing.TB, b bundle, n int) (withPK, total float64) {
	tb.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO idemq_inbox_scopes (name) VALUES ('orders')`,
		`INSERT INTO idemq_inbox (expires_at, key_id, scope_id, status, fingerprint)
		SELECT now() + interval '7 days' + i * interval '1 millisecond',
			gen_random_uuid(), 1, 2, sha256(i::text::bytea)
		FROM generate_series(1, $1) i`,
		`VACUUM ANALYZE idemq_inbox`,
	} {
		args := []any{}
		if len(sql) > 100 {
			args = append(args, n)
		}
		if _, err := b.pool.Exec(ctx, sql, args...); err != nil {
			tb.Fatal(err)
		}
	}
	var heapAndPK, all int64
	err := b.pool.QueryRow(ctx, `SELECT
		pg_table_size('idemq_inbox') + pg_relation_size('idemq_inbox_pkey'),
		pg_total_relation_size('idemq_inbox')`).Scan(&heapAndPK, &all)
	if err != nil {
		tb.Fatal(err)
	}
	return float64(heapAndPK) / float64(n), float64(all) / float64(n)
}

func TestRecordSizeStaysUnder200Bytes(t *testing.T) {
	t.Parallel()
	withPK, total := recordBytes(t, setup(t, inbox.Config{}), 100_000)
	t.Logf("bytes per record: %.1f with the primary key, %.1f with every index", withPK, total)
	if withPK > 200 {
		t.Fatalf("%.1f bytes per record with the primary key, want <= 200", withPK)
	}
}

// BenchmarkRecordSize reports the storage of one million records.
func BenchmarkRecordSize(b *testing.B) {
	withPK, total := recordBytes(b, setup(b, inbox.Config{}), 1_000_000)
	for b.Loop() {
	}
	b.ReportMetric(withPK, "B/record")
	b.ReportMetric(total, "B/record-all-indexes")
}
