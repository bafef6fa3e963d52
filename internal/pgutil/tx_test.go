package pgutil_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/pgutil"
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
	tx, err := pgutil.BeginBatch(ctx, pool, b)
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
	if _, err := pgutil.BeginBatch(ctx, pool, b); err == nil {
		t.Fatal("a failing batch began a transaction")
	}

	b = &pgx.Batch{}
	b.Queue(`INSERT INTO t VALUES (1)`)
	tx, err := pgutil.BeginBatch(ctx, pool, b)
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
