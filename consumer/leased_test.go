package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
)

// mailbox is the downstream system of the leased tests, outside the inbox's
// transactions: it keeps one mail per key and, like any fenced resource,
// rejects a writer whose token is older than the last one it saw.
type mailbox struct{ pool *pgxpool.Pool }

func newMailbox(t *testing.T, pool *pgxpool.Pool) mailbox {
	_, err := pool.Exec(context.Background(), `CREATE TABLE mails (key text PRIMARY KEY, token bigint NOT NULL, sender text NOT NULL)`)
	if err != nil {
		t.Fatal(err)
	}
	return mailbox{pool}
}

var errStaleToken = errors.New("mailbox: stale fencing token")

func (m mailbox) send(ctx context.Context, lease idemq.Lease, sender string) error {
	tag, err := m.pool.Exec(ctx, `INSERT INTO mails VALUES ($1, $2, $3)
		ON CONFLICT (key) DO UPDATE SET token = excluded.token, sender = excluded.sender
		WHERE mails.token < excluded.token`, lease.Key, lease.Token, sender)
	if err == nil && tag.RowsAffected() == 0 {
		err = errStaleToken
	}
	return err
}

func newLeased(t *testing.T, pool *pgxpool.Pool, owner string, ttl time.Duration, h consumer.LeasedHandler) *consumer.Consumer {
	t.Helper()
	c, err := consumer.NewLeased(pool, "mailer", h, consumer.Config{Owner: owner, LeaseTTL: ttl,
		Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// A stalls past its lease; B takes over and completes. A's late write is
// rejected downstream by the fencing token, its finalize by the inbox, and
// B's result stands.
func TestLeasedTakeoverRejectsTheStaleWorker(t *testing.T) {
	pool := setup(t)
	mails := newMailbox(t, pool)
	ctx := context.Background()
	started, resume := make(chan struct{}), make(chan struct{})
	var sendErrA error
	a := newLeased(t, pool, "worker-a", time.Hour, func(ctx context.Context, m *consumer.Message, lease idemq.Lease) error {
		close(started)
		<-resume // a long pause: GC, a stuck downstream call
		sendErrA = mails.send(context.WithoutCancel(ctx), lease, "worker-a")
		return nil
	})
	b := newLeased(t, pool, "worker-b", time.Hour, func(ctx context.Context, m *consumer.Message, lease idemq.Lease) error {
		return mails.send(ctx, lease, "worker-b")
	})

	resultA := make(chan consumer.Result)
	go func() { resultA <- a.Process(ctx, msg("mail-1", "hello")) }()
	<-started
	if r := b.Process(ctx, msg("mail-1", "hello")); r.Outcome != consumer.Retry || !errors.Is(r.Err, consumer.ErrInProgress) || r.RetryAfter <= 0 {
		t.Fatalf("B during A's live lease: %+v, want Retry after the lease", r)
	}
	if _, err := pool.Exec(ctx, `UPDATE idemq_inbox SET lease_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	// A's stalled attempt has not failed, so B's takeover is attempt 1.
	if r := b.Process(ctx, msg("mail-1", "hello")); r.Outcome != consumer.Applied || r.Attempts != 1 {
		t.Fatalf("B's takeover: %+v, want Applied as attempt 1", r)
	}
	close(resume)
	if r := <-resultA; r.Outcome != consumer.Retry || !errors.Is(r.Err, idemq.ErrLeaseLost) {
		t.Fatalf("A after the takeover: %+v, want Retry with ErrLeaseLost", r)
	}
	if !errors.Is(sendErrA, errStaleToken) {
		t.Fatalf("A's downstream write: %v, want it rejected as stale", sendErrA)
	}
	var sender string
	if err := pool.QueryRow(ctx, `SELECT sender FROM mails WHERE key = 'mail-1'`).Scan(&sender); err != nil || sender != "worker-b" {
		t.Fatalf("mail sent by %q (%v), want worker-b", sender, err)
	}
	rec, err := b.Store().Get(ctx, "mailer", "mail-1")
	if err != nil || rec.Status != inbox.Succeeded {
		t.Fatalf("record after the takeover: %+v, %v", rec, err)
	}
	if r := a.Process(ctx, msg("mail-1", "hello")); r.Outcome != consumer.Duplicate {
		t.Fatalf("redelivery to A: %+v, want Duplicate", r)
	}
}

// A handler that runs longer than its lease keeps it: the consumer extends
// it, so nobody can take over meanwhile.
func TestLeaseIsExtendedWhileTheHandlerRuns(t *testing.T) {
	pool := setup(t)
	ctx := context.Background()
	running := make(chan struct{})
	finish := make(chan struct{})
	a := newLeased(t, pool, "worker-a", 600*time.Millisecond, func(ctx context.Context, m *consumer.Message, lease idemq.Lease) error {
		close(running)
		<-finish
		return ctx.Err()
	})
	b := newLeased(t, pool, "worker-b", time.Minute, func(context.Context, *consumer.Message, idemq.Lease) error {
		t.Error("B ran the handler while A held the key")
		return nil
	})
	done := make(chan consumer.Result)
	go func() { done <- a.Process(ctx, msg("long", "p")) }()
	<-running
	var first time.Time
	for range 4 { // two lease lengths
		rec, err := a.Store().Get(ctx, "mailer", "long")
		if err != nil {
			t.Fatal(err)
		}
		if first.IsZero() {
			first = rec.LeaseUntil
		}
		if r := b.Process(ctx, msg("long", "p")); r.Outcome != consumer.Retry {
			t.Fatalf("B during A's run: %+v", r)
		}
		time.Sleep(300 * time.Millisecond)
	}
	rec, err := a.Store().Get(ctx, "mailer", "long")
	if err != nil || !rec.LeaseUntil.After(first) {
		t.Fatalf("lease not extended: first %v, now %+v (%v)", first, rec, err)
	}
	close(finish)
	if r := <-done; r.Outcome != consumer.Applied {
		t.Fatalf("A: %+v", r)
	}
}

func TestLeasedFailureReleasesTheKeyAndRetries(t *testing.T) {
	pool := setup(t)
	mails := newMailbox(t, pool)
	calls := 0
	c := newLeased(t, pool, "worker", time.Minute, func(ctx context.Context, m *consumer.Message, lease idemq.Lease) error {
		calls++
		if calls == 1 {
			return errors.New("smtp 451 try later")
		}
		return mails.send(ctx, lease, "worker")
	})
	r := c.Process(context.Background(), msg("mail-2", "p"))
	if r.Outcome != consumer.Applied || r.Attempts != 2 || calls != 2 {
		t.Fatalf("%+v after %d calls, want Applied on attempt 2", r, calls)
	}
}
