// Package pgtx is idemq's one home for pgx transaction plumbing: a
// transaction begun in the same round trip as its first statements
// ([BeginBatch], on pgx's own Batch.BeginTx), and the wrappers the consumer
// hands to handlers ([Handler], [Batch], with the one savepoint name
// idemq_sp_message). Every transaction keeps pgx's guard: after Commit or
// Rollback each method fails with pgx.ErrTxClosed.
package pgtx

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/nilcheck"
)

// Beginner is the smallest handle BeginBatch accepts: a *pgxpool.Pool, a
// *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// IsNil reports whether v is nil or an interface holding a nil pointer
// (an unset *pgxpool.Pool passed as a DB), which a plain v == nil misses.
func IsNil(v any) bool { return nilcheck.IsNil(v) }
