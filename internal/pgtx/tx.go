package pgtx

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// errNilDB reports a nil handle given to BeginBatch.
var errNilDB = errors.New("idemq: nil database handle")

// BeginBatch begins a transaction and runs the queries of b in it, all in
// one round trip (pgx.Tx.Begin takes one of its own), and returns the
// transaction: pgx's own (Batch.BeginTx), with its guard against use after
// Commit or Rollback. Read b's results through its queued queries'
// callbacks; if one fails, the transaction is rolled back and the error
// returned.
//
// On a *pgxpool.Pool or a *pgx.Conn (anything that sends batches but is not
// a pgx.Tx) the BEGIN travels with b; on a pgx.Tx (then the transaction is
// a savepoint) b follows the Begin.
func BeginBatch(ctx context.Context, db Beginner, b *pgx.Batch) (pgx.Tx, error) {
	if IsNil(db) {
		return nil, errNilDB
	}
	sender, ok := db.(interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	})
	if _, nested := db.(pgx.Tx); nested || !ok {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return nil, errors.Join(err, tx.Rollback(ctx))
		}
		return tx, nil
	}
	begin := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+1)}
	begin.BeginTx(pgx.TxOptions{})
	begin.QueuedQueries = append(begin.QueuedQueries, b.QueuedQueries...)
	results := sender.SendBatch(ctx, begin)
	tx := results.Tx()
	if err := results.Close(); err != nil {
		// A failed BEGIN leaves tx closed; rolling it back anyway hands a
		// pooled connection back.
		if rerr := tx.Rollback(ctx); !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	return tx, nil
}
