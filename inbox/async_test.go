package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/testenv"
)

// TestAsyncAcquireStaysInItsStatement: AsyncAcquire turns off
// synchronous_commit for the claim's own transaction only: the session
// that ran it commits durably afterwards, and a Store on the caller's
// transaction ignores it, so the caller's commit stays durable.
func TestAsyncAcquireStaysInItsStatement(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // every statement on the one session
	ctx := context.Background()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := inbox.New(pool, inbox.Config{AsyncAcquire: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if a, err := s.Acquire(ctx, "orders", "k1", fp("a"), "w", time.Minute); err != nil || !a.New {
		t.Fatalf("acquire: %+v, %v", a, err)
	}
	var setting string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil || setting != "on" {
		t.Fatalf("synchronous_commit on the session after an async acquire: %q, %v; want on", setting, err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	inTx, err := inbox.New(tx, inbox.Config{AsyncAcquire: true})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := inTx.Acquire(ctx, "orders", "k2", fp("a"), "w", time.Minute); err != nil || !a.New {
		t.Fatalf("acquire in a transaction: %+v, %v", a, err)
	}
	if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil || setting != "on" {
		t.Fatalf("synchronous_commit in the caller's transaction after an acquire: %q, %v; want on", setting, err)
	}
}
