package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the inbox (issue 23): settings that would round
// to nothing, keys with a NUL, and a Store used before Migrate.

// TestBadInputSettings: a Retention under Postgres's 1 µs unit and a lease
// under MinLeaseTTL are refused, and a bad Schema is blamed on Schema.
func TestBadInputSettings(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	var ce *idemq.ConfigError
	if _, err := inbox.New(b.pool, inbox.Config{Retention: time.Nanosecond}); !errors.As(err, &ce) || ce.Field != "Retention" {
		t.Errorf("Retention of 1ns: %v, want a ConfigError on Retention", err)
	}
	if _, err := inbox.New(b.pool, inbox.Config{Schema: "1st"}); !errors.As(err, &ce) || ce.Field != "Schema" {
		t.Errorf("bad Schema: %v, want a ConfigError on Schema", err)
	}
	for _, ttl := range []time.Duration{0, time.Nanosecond, time.Microsecond, -time.Second} {
		if _, err := b.store.Acquire(ctx, "s", "k", fp("p"), "me", ttl); err == nil || !strings.Contains(err.Error(), "minimum") {
			t.Errorf("Acquire with a lease of %v: %v, want the minimum named", ttl, err)
		}
	}
	got, err := b.store.Acquire(ctx, "s", "k", fp("p"), "me", time.Minute)
	if err != nil || !got.New {
		t.Fatalf("Acquire: %+v, %v", got, err)
	}
	if _, err := b.store.Extend(ctx, got.Lease, time.Nanosecond); err == nil {
		t.Error("Extend by 1ns accepted")
	}
}

// TestBadInputKeyWithNUL: Validate names the NUL (and its place), not
// UTF-8.
func TestBadInputKeyWithNUL(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	err := b.claims.Validate("ab\x00c", nil)
	if !errors.Is(err, inbox.ErrInvalidKey) || !strings.Contains(err.Error(), "NUL at byte 2") || strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("NUL key: %v, want ErrInvalidKey naming the NUL", err)
	}
}

// TestBadInputNotMigrated: every kind of call on a database without the
// inbox tables says to run the migrations.
func TestBadInputNotMigrated(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	store, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	claims := claimsOf(store)
	ctx := context.Background()
	calls := map[string]func() error{
		"Get":         func() error { _, err := store.Get(ctx, "s", "k"); return err },
		"BeginClaim":  func() error { _, _, err := claims.BeginClaim(ctx, "s", "k", fp("p")); return err },
		"Acquire":     func() error { _, err := store.Acquire(ctx, "s", "k", fp("p"), "me", time.Minute); return err },
		"GC":          func() error { _, err := store.GC(ctx, 0); return err },
		"Stats":       func() error { _, err := store.Stats(ctx); return err },
		"DeadLetters": func() error { _, err := store.DeadLetters(ctx, inbox.DeadFilter{}); return err },
		"Conflicts":   func() error { _, err := store.Conflicts(ctx, inbox.DeadFilter{}); return err },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, inbox.ErrNotMigrated) || !strings.Contains(err.Error(), "idemq migrate") {
			t.Errorf("%s: %v, want ErrNotMigrated saying to run idemq migrate", name, err)
		}
	}
}
