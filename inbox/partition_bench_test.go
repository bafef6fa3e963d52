package inbox_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/testenv"
)

// layouts are the inbox layouts the benchmarks compare, the plain table
// first: the baseline.
var layouts = []struct {
	name string
	mode inbox.Partitioning
}{{"plain", inbox.Unpartitioned}, {"by-arrival", inbox.PartitionByArrival}, {"by-key", inbox.PartitionByKey}}

// benchPool returns a pool of conns connections on a fresh database.
func benchPool(b *testing.B, conns int32) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// BenchmarkPartitionedClaim compares the per-message path (BeginClaim,
// one business INSERT, COMMIT; 16 workers, UUIDv7 keys) on the plain
// inbox and on both partitioned layouts, each in a table of its own in
// one database, alternating in rounds; ratio = layout / plain.
func BenchmarkPartitionedClaim(b *testing.B) {
	const workers = 16
	pool := benchPool(b, workers+4)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	stores := make([]*inboxsql.Store, len(layouts))
	for i, l := range layouts {
		s, err := inbox.New(pool, inbox.Config{Table: "inbox_" + fmt.Sprint(i), Partitioning: l.mode})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		// As in a deployment, GC has run: the empty table from before
		// partitioning (bucket 0) is gone, and claims no longer probe it.
		if _, err := s.GC(ctx, 0); err != nil {
			b.Fatal(err)
		}
		stores[i] = claimsOf(s)
	}
	apply := func(s *inboxsql.Store, key string) error {
		tx, c, err := s.BeginClaim(ctx, "orders", key, fp(key))
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if !c.New {
			return fmt.Errorf("key %s: not new", key)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, payload) VALUES ($1, $2)`, key, `{"order":42}`); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	const rounds = 10
	per := max(b.N/rounds, 100)
	spent := make([]time.Duration, len(layouts))
	b.ResetTimer()
	for range rounds {
		for i := range layouts {
			keys := make([]string, per)
			for k := range keys {
				keys[k] = uuid.Must(uuid.NewV7()).String()
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range workers {
				wg.Go(func() {
					for k := next.Add(1) - 1; k < int64(per); k = next.Add(1) - 1 {
						if err := apply(stores[i], keys[k]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			spent[i] += time.Since(start)
		}
	}
	b.StopTimer()
	for i, l := range layouts {
		rate := float64(per*rounds) / spent[i].Seconds()
		b.ReportMetric(rate, l.name+"-msg/s")
		if i > 0 {
			b.ReportMetric(spent[0].Seconds()/spent[i].Seconds(), l.name+"-ratio")
		}
	}
}

// BenchmarkPartitionedStorage fills each layout with n records shaped as
// a claim writes them (UUIDv7 keys, SHA-256 fingerprints) and reports the
// bytes per record (heap and primary key; and with every index), then
// expires them all and reports the WAL that expiry wrote per record: the
// plain table's batched GC DELETE and the VACUUM after it, against the
// partitioned layouts' DROP of the partition. One fill of 1,000,000
// records per layout and run, whatever b.N.
func BenchmarkPartitionedStorage(b *testing.B) {
	const n = 1_000_000
	ctx := context.Background()
	type figures struct{ withPK, total, wal float64 }
	got := make([]figures, len(layouts))
	for i, l := range layouts {
		pool := benchPool(b, 4)
		cfg := inbox.Config{Partitioning: l.mode}
		if l.mode != inbox.Unpartitioned {
			cfg.Retention, cfg.PartitionInterval = time.Hour, time.Hour
		}
		s, err := inbox.New(pool, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		// Every record two hours old: past the partitioned layouts'
		// retention, and in one partition of theirs.
		var bucket int64
		if err := pool.QueryRow(ctx, `SELECT floor(extract(epoch FROM now() - interval '2 hours') / 3600)::bigint`).Scan(&bucket); err != nil {
			b.Fatal(err)
		}
		stmts := []string{`INSERT INTO idemq_inbox_scopes (name) VALUES ('orders')`}
		// UUIDv7 keys in the order a producer makes them: a thousand
		// per millisecond, ordered within it by the counter in rand_a.
		keys := `(lpad(to_hex((extract(epoch FROM now() - interval '2 hours') * 1000)::bigint + i / 1000), 12, '0')
			|| '7' || lpad(to_hex(mod(i, 1000)), 3, '0') || '8' || substr(md5(i::text), 1, 15))::uuid`
		switch l.mode {
		case inbox.Unpartitioned:
			stmts = append(stmts, `INSERT INTO idemq_inbox (expires_at, key_id, scope_id, status, fingerprint)
			SELECT now() - interval '1 hour' - i * interval '1 microsecond', `+keys+`, 1, 2, sha256(i::text::bytea) FROM generate_series(1, $1) i`)
		default:
			// Records that arrived (or were keyed) two hours ago, in the
			// partition of their bucket, which is past the retention of an
			// hour: GC drops it.
			stmts = append(stmts,
				fmt.Sprintf(`CREATE TABLE idemq_inbox_p%d PARTITION OF idemq_inbox FOR VALUES FROM (%d) TO (%d)`, bucket, bucket, bucket+1),
				fmt.Sprintf(`INSERT INTO idemq_inbox (bucket, expires_at, key_id, scope_id, status, fingerprint)
			SELECT %d, now() - interval '1 hour' - i * interval '1 microsecond', `+keys+`, 1, 2, sha256(i::text::bytea) FROM generate_series(1, $1) i`, bucket))
		}
		stmts = append(stmts, `VACUUM ANALYZE idemq_inbox`)
		for _, sql := range stmts {
			var args []any
			if len(sql) > 200 {
				args = append(args, n)
			}
			if _, err := pool.Exec(ctx, sql, args...); err != nil {
				b.Fatal(err)
			}
		}
		var heapAndPK, all int64
		err = pool.QueryRow(ctx, `
SELECT sum(pg_table_size(t.oid) + (SELECT coalesce(sum(pg_relation_size(x.indexrelid)), 0) FROM pg_index x
		WHERE x.indrelid = t.oid AND x.indisprimary))::bigint,
	sum(pg_total_relation_size(t.oid))::bigint
FROM pg_class t WHERE t.relkind = 'r' AND (t.oid = 'idemq_inbox'::regclass
	OR t.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'idemq_inbox'::regclass))`).Scan(&heapAndPK, &all)
		if err != nil {
			b.Fatal(err)
		}
		got[i].withPK, got[i].total = float64(heapAndPK)/n, float64(all)/n
		var dbOID int64
		var before string
		if err := pool.QueryRow(ctx, `SELECT oid::int8, pg_current_wal_lsn()::text FROM pg_database WHERE datname = current_database()`).Scan(&dbOID, &before); err != nil {
			b.Fatal(err)
		}
		// A slot keeps the WAL from here until it is read: the plain
		// table's expiry writes more than the server keeps otherwise.
		slot := fmt.Sprintf("idemq_bench_wal_%d", dbOID)
		if _, err := pool.Exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
			b.Fatal(err)
		}
		dropSlot := func() { _, _ = pool.Exec(context.WithoutCancel(ctx), `SELECT pg_drop_replication_slot($1)`, slot) }
		b.Cleanup(dropSlot)
		if _, err := s.GC(ctx, 1000); err != nil {
			b.Fatal(err)
		}
		if l.mode == inbox.Unpartitioned {
			if _, err := pool.Exec(ctx, `VACUUM idemq_inbox`); err != nil {
				b.Fatal(err)
			}
		}
		wal, err := ownWAL(ctx, pool, dbOID, before)
		dropSlot()
		if err != nil {
			b.Fatal(err)
		}
		var left int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemq_inbox`).Scan(&left); err != nil || left != 0 {
			b.Fatalf("%s: %d records left after GC, %v", l.name, left, err)
		}
		got[i].wal = float64(wal) / n
	}
	for range b.N {
	}
	for i, l := range layouts {
		b.ReportMetric(got[i].withPK, l.name+"-B/record")
		b.ReportMetric(got[i].total, l.name+"-B/record-all-indexes")
		b.ReportMetric(got[i].wal, l.name+"-expiry-WAL-B/record")
	}
}

// ownWAL returns the bytes of WAL written since lsn for this database
// alone: other suites share the server and write WAL meanwhile. It reads
// the records with pg_walinspect (Postgres 15's contrib, created here in
// the benchmark's database; idemq needs no extension) and counts those
// that touch a block of the database, and every record of the
// transactions that wrote them (their commits).
func ownWAL(ctx context.Context, pool *pgxpool.Pool, dbOID int64, lsn string) (int64, error) {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		return 0, fmt.Errorf("the benchmark reads WAL with pg_walinspect (postgresql-contrib): %w", err)
	}
	var n int64
	err := pool.QueryRow(ctx, `
WITH r AS MATERIALIZED (SELECT xid::text AS x, record_length, block_ref FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())),
mine AS (SELECT DISTINCT x FROM r WHERE block_ref LIKE $2 AND x <> '0')
SELECT coalesce(sum(record_length), 0)::bigint FROM r WHERE block_ref LIKE $2 OR x IN (SELECT x FROM mine)`,
		lsn, fmt.Sprintf("%%/%d/%%", dbOID)).Scan(&n)
	return n, err
}
