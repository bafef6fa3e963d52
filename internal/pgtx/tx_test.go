package pgtx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/testenv"
)

func rows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestBeginBatchRunsTheBatchInTheTransaction(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	var status string
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO t VALUES (1)`)
	b.Queue(`SELECT CASE WHEN now() = statement_timestamp() THEN 'implicit' ELSE 'explicit' END`).QueryRow(func(r pgx.Row) error {
		return r.Scan(&status)
	})
	tx, err := pgtx.BeginBatch(ctx, pool, b)
	if err != nil {
		t.Fatal(err)
	}
	if status != "explicit" {
		t.Fatalf("the batch ran in an %s transaction", status)
	}

	// A nested transaction is a savepoint: rolling it back keeps the rest.
	nested, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nested.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	if err := nested.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rows(t, pool) != 0 {
		t.Fatal("uncommitted rows visible outside the transaction")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("second Commit = %v, want ErrTxClosed", err)
	}
	if n := rows(t, pool); n != 1 {
		t.Fatalf("%d rows committed, want 1", n)
	}
}

func TestBeginBatchFailuresLeaveNothingOpen(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO t VALUES (1)`)
	b.Queue(`SELECT 1/0`)
	if _, err := pgtx.BeginBatch(ctx, pool, b); err == nil {
		t.Fatal("a failing batch began a transaction")
	}

	b = &pgx.Batch{}
	b.Queue(`INSERT INTO t VALUES (1)`)
	tx, err := pgtx.BeginBatch(ctx, pool, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of a failed transaction = %v, want ErrTxCommitRollback", err)
	}
	if rows(t, pool) != 0 {
		t.Fatal("a failed transaction left rows")
	}
	// Every connection went back to the pool idle, none in a transaction.
	for range pool.Stat().TotalConns() {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s := conn.Conn().PgConn().TxStatus(); s != 'I' {
			t.Fatalf("a pooled connection is in transaction state %c", s)
		}
		defer conn.Release()
	}
}

// After Commit or Rollback every wrapper refuses to run statements, as
// pgx's own transactions do: a leaked tx must not write on a connection
// that went back to the pool.
func TestEveryWrapperIsClosedAfterCommit(t *testing.T) {
	pool := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (v int)`); err != nil {
		t.Fatal(err)
	}
	begin := func() pgx.Tx {
		tx, err := pgtx.BeginBatch(ctx, pool, &pgx.Batch{})
		if err != nil {
			t.Fatal(err)
		}
		return tx
	}
	batchAfterWrite := func() (pgx.Tx, func() error) {
		tx := begin()
		b := pgtx.NewBatch(tx)
		b.Next()
		if _, err := b.Exec(ctx, `INSERT INTO t VALUES (1)`); err != nil {
			t.Fatal(err)
		}
		b.Done(ctx, false)
		b.Next() // the next message's savepoint is pending
		return b, func() error { return tx.Commit(ctx) }
	}
	cases := map[string]func() (pgx.Tx, func() error){
		"BeginBatch": func() (pgx.Tx, func() error) {
			tx := begin()
			return tx, func() error { return tx.Commit(ctx) }
		},
		"BeginBatch rolled back": func() (pgx.Tx, func() error) {
			tx := begin()
			return tx, func() error { return tx.Rollback(ctx) }
		},
		"Handler": func() (pgx.Tx, func() error) {
			tx := begin()
			return pgtx.Handler(tx), func() error { return tx.Commit(ctx) }
		},
		"Batch": batchAfterWrite,
	}
	for name, open := range cases {
		tx, end := open()
		if err := end(); err != nil {
			t.Fatalf("%s: end: %v", name, err)
		}
		before := rows(t, pool)
		if _, err := tx.Exec(ctx, `INSERT INTO t VALUES (2)`); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s: Exec after the end = %v, want ErrTxClosed", name, err)
		}
		if _, err := tx.Query(ctx, `INSERT INTO t VALUES (2)`); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s: Query after the end = %v, want ErrTxClosed", name, err)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO t VALUES (2) RETURNING v`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s: QueryRow after the end = %v, want ErrTxClosed", name, err)
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO t VALUES (2)`)
		if err := tx.SendBatch(ctx, b).Close(); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s: SendBatch after the end = %v, want ErrTxClosed", name, err)
		}
		if _, err := tx.Begin(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("%s: Begin after the end = %v, want ErrTxClosed", name, err)
		}
		if n := rows(t, pool); n != before {
			t.Errorf("%s: a closed transaction wrote %d rows", name, n-before)
		}
	}
}
