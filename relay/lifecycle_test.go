package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// TestRunOnceAtATimeAndAgain: Ready closes once the relay listens, a
// second concurrent Run is refused with idemq.ErrRunning, and a Run after
// the first returned delivers again.
func TestRunOnceAtATimeAndAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	r := newRelay(t, b, rec, relay.Config{})
	stop := run(t, r)
	if err := r.Run(b.ctx); !errors.Is(err, idemq.ErrRunning) {
		t.Fatalf("concurrent Run: %v, want idemq.ErrRunning", err)
	}
	enqueue(t, b, keyed("d", 2, 1, 0)...)
	idemqtest.WaitFor(t, "first run delivers", func() bool { return distinct(rec) == 2 })
	stop()
	enqueue(t, b, keyed("d", 2, 1, 2)...)
	run(t, r)
	idemqtest.WaitFor(t, "second run delivers", func() bool { return distinct(rec) == 4 })
	if dups := checkOrder(t, rec.deliveries()); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}

// TestRunWithoutTablesSaysToMigrate: Run on a database without the
// outbox's tables returns at once with an error that says to run the
// migrations, and so does a running relay whose tables are dropped.
func TestRunWithoutTablesSaysToMigrate(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	r := newRelay(t, bundle{ctx: context.Background(), pool: pool, ob: ob}, rec, relay.Config{})
	err = r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "run the migrations") {
		t.Fatalf("Run without tables: %v, want an error that says to run the migrations", err)
	}

	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `DROP TABLE idemq_outbox, idemq_outbox_dead`); err != nil {
		t.Fatal(err)
	}
	<-running.Done() // the next poll finds the tables gone
	if err := running.Err(); err == nil || !strings.Contains(err.Error(), "run the migrations") {
		t.Fatalf("Run after the tables were dropped: %v, want an error that says to run the migrations", err)
	}
	if n := len(rec.deliveries()); n != 0 {
		t.Fatalf("%d deliveries from an empty outbox", n)
	}
}

// TestRunOnClosedPoolFails: Run on a closed pool returns an error instead of
// logging forever.
func TestRunOnClosedPoolFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, err := pgxpool.New(b.ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	r := newRelay(t, bundle{ctx: b.ctx, pool: pool, ob: b.ob}, &recorder{}, relay.Config{})
	pool.Close()
	if err := r.Run(b.ctx); err == nil || !strings.Contains(err.Error(), "pool is closed") {
		t.Fatalf("Run on a closed pool: %v", err)
	}
}
