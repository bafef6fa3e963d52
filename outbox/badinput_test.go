package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the outbox (issue 23): each careless call gets an
// error that says what to pass, never a panic.

// TestBadInputTypedNilTxIsRefused: a nil pgx.Tx, and a typed nil such as
// (*pgxpool.Tx)(nil) that a plain == nil misses, are refused by every
// call that takes the caller's transaction, instead of panicking.
func TestBadInputTypedNilTxIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	var typed *pgxpool.Tx
	for name, tx := range map[string]pgx.Tx{"nil": nil, "typed nil": typed} {
		if err := b.ob.EnqueueTx(ctx, tx, outbox.Message{Destination: "orders", Payload: []byte("{}")}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("EnqueueTx(%s tx) = %v, want an idemq.ErrConfig", name, err)
		}
		if _, err := b.ob.ReplayTx(ctx, tx, outbox.DeadFilter{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("ReplayTx(%s tx) = %v, want an idemq.ErrConfig", name, err)
		}
		if _, err := b.ob.PurgeTx(ctx, tx, outbox.DeadFilter{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("PurgeTx(%s tx) = %v, want an idemq.ErrConfig", name, err)
		}
	}
}

// TestBadInputTypedNilDBIsRefused: New refuses a nil DB and a typed nil
// such as (*pgxpool.Pool)(nil), which a plain == nil misses, with an
// idemq.ErrConfig naming db, instead of panicking on the first query.
func TestBadInputTypedNilDBIsRefused(t *testing.T) {
	t.Parallel()
	var (
		pool *pgxpool.Pool
		conn *pgx.Conn
		tx   *pgxpool.Tx
	)
	for name, db := range map[string]outbox.DB{"nil": nil, "typed-nil *pgxpool.Pool": pool, "typed-nil *pgx.Conn": conn, "typed-nil *pgxpool.Tx": tx} {
		ob, err := outbox.New(db, outbox.Config{})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "db" || !errors.Is(err, idemq.ErrConfig) || ob != nil {
			t.Errorf("New(%s) = %v, %v; want an idemq.ErrConfig naming db", name, ob, err)
		}
	}
}

// TestBadInputMaxPayloadAboveTheMaximumIsRefused: a MaxPayload above what
// Postgres stores in a value or a relay can hand a broker is refused,
// naming the field; the maximum itself is accepted.
func TestBadInputMaxPayloadAboveTheMaximumIsRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, n := range []int{outbox.MaxPayloadMax + 1, 1 << 31} {
		_, err := outbox.New(pool, outbox.Config{MaxPayload: n})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "MaxPayload" {
			t.Errorf("New(MaxPayload: %d) = %v, want a ConfigError for MaxPayload", n, err)
		}
	}
	if _, err := outbox.New(pool, outbox.Config{MaxPayload: outbox.MaxPayloadMax}); err != nil {
		t.Errorf("New(MaxPayload: MaxPayloadMax) = %v", err)
	}
}

// TestBadInputDeadFilterRefusesBlankValues: a filter field of blanks looks
// like a filter and is none, a NUL byte got a raw SQLSTATE from Postgres,
// and a negative limit a bare error: every dead-letter call refuses them
// with an idemq.ErrConfig naming the field, and nothing is replayed or
// purged.
func TestBadInputDeadFilterRefusesBlankValues(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	if err := b.ob.Enqueue(b.ctx, outbox.Message{Destination: "billing", Key: "k", Payload: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	kill(t, b, "boom", "a")
	for _, c := range []struct {
		f     outbox.DeadFilter
		field string
	}{
		{outbox.DeadFilter{ErrorClass: " "}, "ErrorClass"},
		{outbox.DeadFilter{Destination: "\t"}, "Destination"},
		{outbox.DeadFilter{DestinationPrefix: "  "}, "DestinationPrefix"},
		{outbox.DeadFilter{Key: "\n"}, "Key"},
		{outbox.DeadFilter{KeyPrefix: " "}, "KeyPrefix"},
		{outbox.DeadFilter{Key: "k\x00"}, "Key"},
		{outbox.DeadFilter{ErrorClass: "\x00"}, "ErrorClass"},
		{outbox.DeadFilter{Limit: -1}, "Limit"},
	} {
		calls := map[string]func() error{
			"DeadLetters": func() error { _, err := b.ob.DeadLetters(b.ctx, c.f); return err },
			"DeadGroups":  func() error { _, err := b.ob.DeadGroups(b.ctx, c.f); return err },
			"Replay":      func() error { _, err := b.ob.Replay(b.ctx, c.f); return err },
			"Purge":       func() error { _, err := b.ob.Purge(b.ctx, c.f); return err },
		}
		for name, call := range calls {
			err := call()
			if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != c.field {
				t.Errorf("%s(%+v) = %v, want an idemq.ErrConfig naming %s", name, c.f, err, c.field)
			}
		}
	}
	dead, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
	if err != nil || len(dead) != 1 {
		t.Fatalf("%d dead letters left (%v), want the 1 no call was allowed to touch", len(dead), err)
	}
}

// TestBadInputReplayAndPurgeOfEverythingMustSayAll: a filter whose fields
// are all empty (as a blank form field or an unset variable leaves it)
// replayed or purged every dead letter; Replay and Purge refuse it with an
// idemq.ErrConfig, as inbox.DeadFilter does, and All says everything is
// meant. Listing needs no All.
func TestBadInputReplayAndPurgeOfEverythingMustSayAll(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	for _, p := range []string{"a", "b"} {
		if err := b.ob.Enqueue(b.ctx, outbox.Message{Destination: "billing", Key: p, Payload: []byte(p)}); err != nil {
			t.Fatal(err)
		}
	}
	kill(t, b, "boom", "a", "b")
	for name, f := range map[string]outbox.DeadFilter{
		"zero":          {},
		"empty fields":  {Destination: "", Key: "", ErrorClass: ""},
		"a limit alone": {Limit: 1},
	} {
		if n, err := b.ob.Purge(b.ctx, f); !errors.Is(err, idemq.ErrConfig) || n != 0 {
			t.Errorf("Purge %s: %d, %v; want an ErrConfig and nothing purged", name, n, err)
		}
		if n, err := b.ob.Replay(b.ctx, f); !errors.Is(err, idemq.ErrConfig) || n != 0 {
			t.Errorf("Replay %s: %d, %v; want an ErrConfig and nothing replayed", name, n, err)
		}
	}
	if dead, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{}); err != nil || len(dead) != 2 {
		t.Fatalf("after refused calls: %d dead letters, %v; want both kept (and listed without All)", len(dead), err)
	}
	if n, err := b.ob.Replay(b.ctx, outbox.DeadFilter{Limit: 1, All: true}); err != nil || n != 1 {
		t.Fatalf("replay of the first with All: %d, %v", n, err)
	}
	if n, err := b.ob.Purge(b.ctx, outbox.DeadFilter{All: true}); err != nil || n != 1 {
		t.Fatalf("purge of every dead letter with All: %d, %v", n, err)
	}
}

// TestBadInputEnqueueOnAnUnmigratedDatabase: Enqueue on a database without
// the outbox's tables says what to run instead of a raw SQLSTATE 42P01,
// and still wraps Postgres's error.
func TestBadInputEnqueueOnAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	ob, err := outbox.New(testenv.Postgres(t), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = ob.Enqueue(context.Background(), outbox.Message{Destination: "orders", Payload: []byte("{}")})
	if !errors.Is(err, outbox.ErrNotMigrated) || !strings.Contains(err.Error(), "idemq migrate --components outbox") || !strings.Contains(err.Error(), "42P01") {
		t.Errorf("Enqueue on an unmigrated database: %v", err)
	}
}
