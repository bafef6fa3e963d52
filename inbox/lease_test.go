package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
)

func expireLease(t *testing.T, b bundle, key string) {
	t.Helper()
	if _, err := b.pool.Exec(context.Background(),
		`UPDATE idemq_inbox SET lease_until = now() - interval '1 millisecond' WHERE key_text = $1`, key); err != nil {
		t.Fatal(err)
	}
}

func TestLeaseTakeoverFencesTheStaleWorker(t *testing.T) {
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	a, err := b.store.Acquire(ctx, "mailer", "email-1", fp("p"), "worker-a", time.Minute)
	if err != nil || !a.New {
		t.Fatalf("A acquire = %+v, %v", a, err)
	}
	busy, err := b.store.Acquire(ctx, "mailer", "email-1", fp("p"), "worker-b", time.Minute)
	if err != nil || busy.New || busy.Existing.Status != inbox.InProgress || busy.Existing.Owner != "worker-a" {
		t.Fatalf("B acquire under A's live lease = %+v, %v; want A's IN_PROGRESS record", busy, err)
	}

	expireLease(t, b, "email-1")
	bl, err := b.store.Acquire(ctx, "mailer", "email-1", fp("p"), "worker-b", time.Minute)
	if err != nil || !bl.New {
		t.Fatalf("B takeover = %+v, %v", bl, err)
	}
	if bl.Lease.Token <= a.Lease.Token {
		t.Fatalf("takeover token %d after %d: the fencing token must grow", bl.Lease.Token, a.Lease.Token)
	}
	if err := b.store.Complete(ctx, bl.Lease, []byte("sent by B")); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Complete(ctx, a.Lease, []byte("sent by A")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("A's late Complete = %v, want ErrLeaseLost", err)
	}
	if err := b.store.FailFinal(ctx, a.Lease, errors.New("late")); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("A's late Fail = %v, want ErrLeaseLost", err)
	}
	rec, err := b.store.Get(ctx, "mailer", "email-1")
	if err != nil || rec.Status != inbox.Succeeded || string(rec.Result) != "sent by B" {
		t.Fatalf("record = %+v, %v; B's result must stand", rec, err)
	}
	dup, err := b.store.Acquire(ctx, "mailer", "email-1", fp("p"), "worker-c", time.Minute)
	if err != nil || dup.New || string(dup.Existing.Result) != "sent by B" {
		t.Fatalf("acquire after completion = %+v, %v; want the stored result", dup, err)
	}
}

func TestLeaseFailReleasesOrDeadLetters(t *testing.T) {
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	first, err := b.store.Acquire(ctx, "mailer", "k", fp("p"), "w", time.Minute)
	if err != nil || !first.New {
		t.Fatal(first, err)
	}
	if err := b.store.Fail(ctx, first.Lease, errors.New("smtp 451")); err != nil {
		t.Fatal(err)
	}
	retry, err := b.store.Acquire(ctx, "mailer", "k", fp("p"), "w", time.Minute)
	if err != nil || !retry.New || retry.Lease.Token <= first.Lease.Token {
		t.Fatalf("acquire after a retryable failure = %+v, %v; want a token above %d", retry, err, first.Lease.Token)
	}
	if err := b.store.FailFinal(ctx, retry.Lease, errors.New("smtp 550")); err != nil {
		t.Fatal(err)
	}
	dead, err := b.store.Acquire(ctx, "mailer", "k", fp("p"), "w", time.Minute)
	if err != nil || dead.New || dead.Existing.Status != inbox.FailedFinal || dead.Existing.LastError != "smtp 550" {
		t.Fatalf("acquire of a dead letter = %+v, %v", dead, err)
	}
	if _, err := b.store.Acquire(ctx, "mailer", "k", fp("other"), "w", time.Minute); !errors.As(err, new(*inbox.ConflictError)) {
		t.Fatalf("acquire with another fingerprint = %v, want *ConflictError", err)
	}
}

func TestExtendKeepsTheLeaseAlive(t *testing.T) {
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	c, err := b.store.Acquire(ctx, "mailer", "k", fp("p"), "w", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	extended, err := b.store.Extend(ctx, c.Lease, time.Hour)
	if err != nil || !extended.Until.After(c.Lease.Until.Add(30*time.Minute)) {
		t.Fatalf("extend = %+v, %v", extended, err)
	}
	if err := b.store.Complete(ctx, extended, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Extend(ctx, extended, time.Hour); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("extend after completion = %v, want ErrLeaseLost", err)
	}
}
