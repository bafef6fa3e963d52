// Package benchseed fills the default outbox tables (public.idemq_outbox
// and its dead letters) with large data sets for the benchmarks of the
// gauges, the dead-letter groups and the console's pages, with
// generate_series in one statement each.
package benchseed

import (
	"context"

	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the seeds need of a pool or a connection. The caller
// migrates the outbox first: benchseed stands below the stores and
// imports none of them.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Backlog inserts n pending rows: 8 destinations (dest-0 to dest-7),
// 100,000 keys (k0 to k99999) over the 64 partitions and one row in 50
// unkeyed; then analyzes the table, as autovacuum would.
func Backlog(ctx context.Context, db DB, n int) error {
	if _, err := db.Exec(ctx, `INSERT INTO idemq_outbox (id, destination, key, payload)
SELECT gen_random_uuid(), 'dest-' || (i % 8), CASE WHEN i % 50 = 0 THEN NULL ELSE 'k' || (i % 100000) END, '\x7b7d'
FROM generate_series(1, $1) AS i`, n); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `ANALYZE idemq_outbox`)
	return err
}

// DeadLetters inserts n dead letters with seqs from 1,000,000,000 on: 23
// error classes over the 8 destinations (184 groups), failed within the
// last day; then vacuums the table, as autovacuum leaves it at rest.
func DeadLetters(ctx context.Context, db DB, n int) error {
	if _, err := db.Exec(ctx, `INSERT INTO idemq_outbox_dead (seq, id, created_at, failed_at, attempts, destination, payload, key, last_error, error_class)
SELECT 1000000000 + i, gen_random_uuid(), now() - interval '1 day', now() - (i % 86400) * interval '1 second', 5,
       'dest-' || (i % 8), '\x7b7d', 'k' || (i % 50000), 'error ' || (i % 23) || ' on ' || i, 'error <n> on <n> #' || (i % 23)
FROM generate_series(1, $1) AS i`, n); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `VACUUM ANALYZE idemq_outbox_dead`)
	return err
}
