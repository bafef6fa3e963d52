package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the consumer (issue 23): each careless use gets
// the error that says what happened and what to do.

// TestBadInputNULKeyIsReportedAsNUL: a key with a NUL byte is refused as
// such, not as "not valid UTF-8".
func TestBadInputNULKeyIsReportedAsNUL(t *testing.T) {
	pool := setup(t)
	c := newConsumer(t, pool, insertOrder, consumer.Config{})
	r := c.Process(context.Background(), msg("order\x001", "p"))
	if r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, inbox.ErrInvalidKey) || !strings.Contains(r.Err.Error(), "NUL") || strings.Contains(r.Err.Error(), "UTF-8") {
		t.Fatalf("NUL key: %+v, want an ErrInvalidKey naming the NUL", r)
	}
	if err := c.ValidKey("\xff"); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("invalid UTF-8 key: %v, want it named as such", err)
	}
}

// TestBadInputHandlerSwallowingAnSQLError: a handler whose statement
// failed (which aborts the transaction) but that returns nil anyway gets a
// failed attempt carrying the SQL error, counted toward MaxAttempts and
// dead-lettered in the end, instead of Retry with no attempt forever; in
// both per-message and batch mode.
func TestBadInputHandlerSwallowingAnSQLError(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "PerMessage"
		if batch {
			name = "Batch"
		}
		t.Run(name, func(t *testing.T) {
			pool := setup(t)
			swallow := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if string(m.Payload) == "bad" {
					_, _ = tx.Exec(ctx, `INSERT INTO no_such_table VALUES (1)`) // the error is dropped
					return nil
				}
				return insertOrder(ctx, tx, m)
			}
			c := newConsumer(t, pool, swallow, consumer.Config{Retry: idemq.Retry{MaxAttempts: 3}})
			ctx := context.Background()
			var r consumer.Result
			if batch {
				rs := c.ProcessBatch(ctx, []*consumer.Message{msg("order-1", "ok"), msg("order-2", "bad"), msg("order-3", "ok")})
				if rs[0].Outcome != consumer.Applied || rs[2].Outcome != consumer.Applied {
					t.Fatalf("the batch's other messages: %+v, %+v; want Applied", rs[0], rs[2])
				}
				r = rs[1]
			} else {
				r = c.Process(ctx, msg("order-2", "bad"))
			}
			if r.Outcome != consumer.DeadLettered || r.Attempts != 3 || !strings.Contains(r.Err.Error(), "no_such_table") {
				t.Fatalf("swallowed SQL error: %+v, want DeadLettered after 3 attempts with the SQL error", r)
			}
			rec, err := c.Store().Get(ctx, c.Scope(), "order-2")
			if err != nil || rec.Status != inbox.FailedFinal || !strings.Contains(rec.LastError, "no_such_table") {
				t.Fatalf("record %+v, %v; want a dead letter keeping the SQL error", rec, err)
			}
		})
	}
}

// TestBadInputConsumerWithoutMigrate: a consumer on a database whose inbox
// was never migrated returns Retry with an error that says to run the
// migrations, and so do the Store's administration calls.
func TestBadInputConsumerWithoutMigrate(t *testing.T) {
	pool := testenv.Postgres(t)
	c, err := consumer.New(pool, "billing", insertOrder, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, r := range map[string]consumer.Result{
		"Process":      c.Process(ctx, msg("order-1", "p")),
		"ProcessBatch": c.ProcessBatch(ctx, []*consumer.Message{msg("order-1", "p")})[0],
	} {
		if r.Outcome != consumer.Retry || !errors.Is(r.Err, inbox.ErrNotMigrated) || !strings.Contains(r.Err.Error(), "idemq migrate") {
			t.Errorf("%s unmigrated: %+v, want Retry with ErrNotMigrated saying to run idemq migrate", name, r)
		}
	}
	if _, err := c.Store().Stats(ctx); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Errorf("Stats unmigrated: %v, want ErrNotMigrated", err)
	}
	if _, err := c.Store().GC(ctx, 0); !errors.Is(err, inbox.ErrNotMigrated) {
		t.Errorf("GC unmigrated: %v, want ErrNotMigrated", err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if r := c.Process(ctx, msg("order-1", "p")); r.Outcome != consumer.Applied {
		t.Fatalf("after Migrate: %+v, want Applied", r)
	}
}

// TestBadInputLeasedContextCancelledGivesTheLeaseBack: a leased consumer
// whose context is cancelled while its handler runs gives the key back at
// once, without counting a failure, instead of leaving an hour-long lease
// to run out: the next delivery is applied right away.
func TestBadInputLeasedContextCancelledGivesTheLeaseBack(t *testing.T) {
	pool := setup(t)
	started := make(chan struct{}, 1)
	calls := 0
	c := newLeased(t, pool, "worker", time.Hour, func(ctx context.Context, m *consumer.Message, lease idemq.Lease) error {
		calls++
		if calls == 1 {
			started <- struct{}{}
			<-ctx.Done() // shutting down mid-call
			return ctx.Err()
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan consumer.Result)
	go func() { done <- c.Process(ctx, msg("mail-1", "p")) }()
	<-started
	cancel()
	if r := <-done; r.Outcome != consumer.Retry || !errors.Is(r.Err, context.Canceled) {
		t.Fatalf("cancelled: %+v, want Retry", r)
	}
	rec, err := c.Store().Get(context.Background(), "mailer", "mail-1")
	if err != nil || rec.Failures != 0 || rec.LeaseUntil.After(time.Now()) {
		t.Fatalf("record after the cancel: %+v, %v; want the lease given back, no failure counted", rec, err)
	}
	if r := c.Process(context.Background(), msg("mail-1", "p")); r.Outcome != consumer.Applied || r.Attempts != 1 {
		t.Fatalf("next delivery: %+v, want Applied at once as attempt 1", r)
	}
}
