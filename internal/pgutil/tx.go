package pgutil

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BeginBatch begins a transaction and runs the queries of b in it, all in
// one round trip (pgx.Tx.Begin takes one of its own), and returns the
// transaction. Read b's results through its queued queries' callbacks; if
// one fails, the transaction is rolled back and the error returned.
//
// On a *pgxpool.Pool or a *pgx.Conn the BEGIN travels with b; on any other
// DB (a pgx.Tx: then the transaction is a savepoint) b follows the Begin.
func BeginBatch(ctx context.Context, db DB, b *pgx.Batch) (pgx.Tx, error) {
	var tx *connTx
	switch db := db.(type) {
	case *pgxpool.Pool:
		conn, err := db.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		tx = &connTx{conn: conn.Conn(), release: conn.Release}
	case *pgx.Conn:
		tx = &connTx{conn: db, release: func() {}}
	default:
		nested, err := db.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if err := nested.SendBatch(ctx, b).Close(); err != nil {
			return nil, errors.Join(err, nested.Rollback(ctx))
		}
		return nested, nil
	}
	begin := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(b.QueuedQueries)+1)}
	begin.Queue("BEGIN")
	begin.QueuedQueries = append(begin.QueuedQueries, b.QueuedQueries...)
	if err := tx.conn.SendBatch(ctx, begin).Close(); err != nil {
		return nil, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, nil
}

// connTx is a transaction begun by BeginBatch on a connection; it behaves
// as pgx's own.
type connTx struct {
	conn    *pgx.Conn
	release func()
	closed  bool
}

func (t *connTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	t.finish(err)
	switch {
	case err != nil:
		return err
	case tag.String() == "ROLLBACK": // the transaction had failed
		return pgx.ErrTxCommitRollback
	}
	return nil
}

func (t *connTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	t.finish(err)
	return err
}

// finish hands the connection back; one whose COMMIT or ROLLBACK failed is
// closed first, since its transaction state is unknown.
func (t *connTx) finish(err error) {
	t.closed = true
	if err != nil {
		_ = t.conn.Close(context.Background())
	}
	t.release()
}

func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return beginSavepoint(ctx, t, 1)
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects opens pgx's large-object API on a savepoint of t, the only
// way to get one for a transaction pgx did not begin itself. On a broken
// transaction it returns the zero LargeObjects, which must not be used.
func (t *connTx) LargeObjects() pgx.LargeObjects {
	lo, err := t.conn.BeginTx(context.Background(), pgx.TxOptions{BeginQuery: "SAVEPOINT idemq_large_objects"})
	if err != nil {
		return pgx.LargeObjects{}
	}
	return lo.LargeObjects()
}

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) Conn() *pgx.Conn { return t.conn }

// savepointTx is a transaction nested in a connTx, as pgx nests its own.
type savepointTx struct {
	*connTx
	name   string
	depth  int
	closed bool
}

func beginSavepoint(ctx context.Context, parent *connTx, depth int) (pgx.Tx, error) {
	name := pgx.Identifier{fmt.Sprintf("idemq_sp_%d", depth)}.Sanitize()
	if _, err := parent.conn.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, err
	}
	return &savepointTx{connTx: parent, name: name, depth: depth}, nil
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	return beginSavepoint(ctx, s.connTx, s.depth+1)
}

func (s *savepointTx) Commit(ctx context.Context) error { return s.end(ctx, "RELEASE SAVEPOINT ") }

func (s *savepointTx) Rollback(ctx context.Context) error {
	return s.end(ctx, "ROLLBACK TO SAVEPOINT ")
}

func (s *savepointTx) end(ctx context.Context, command string) error {
	if s.closed || s.connTx.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, command+s.name)
	return err
}

var (
	_ pgx.Tx = (*connTx)(nil)
	_ pgx.Tx = (*savepointTx)(nil)
)
