package pgstore_test

import (
	"context"
	"testing"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkRecordSize reports the bytes per completed record (see
// requesttest.Fill) of the table with its indexes and TOAST, 20 000
// records after VACUUM.
func BenchmarkRecordSize(b *testing.B) {
	const n = 20_000
	pool := testenv.Postgres(b)
	s := newStore(b, pool, request.RecordTTLDefault)
	requesttest.Fill(b, s, n)
	var total int64
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+pgstore.TableDefault); err != nil {
		b.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1)`, pgstore.TableDefault).Scan(&total); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(total)/n, "B/record")
}
