package endpoints_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// The bad-input suite of the endpoints package (issue 23): every careless
// value gets an error that says what to do, and nothing panics.

// TestBadInputPublisher: NewPublisher without a registry is an ErrConfig;
// PublishTx with a nil transaction returns an error instead of
// panicking; a bad event key's error names the event (not the outbox row)
// and matches ErrInvalidEvent, as does a payload the outbox refuses.
func TestBadInputPublisher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := endpoints.NewPublisher(nil, b.ob); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("NewPublisher(nil, ob): %v, want ErrConfig", err)
	}
	if _, err := endpoints.NewPublisher(b.reg, nil); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("NewPublisher(reg, nil): %v, want ErrConfig", err)
	}
	ok := event("k", 1)
	if _, err := b.pub.PublishTx(b.ctx, nil, ok); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "tx is nil") {
		t.Fatalf("PublishTx(nil tx): %v, want an idemq.ErrConfig", err)
	}
	var nilTx pgx.Tx = (*nilTxType)(nil)
	if _, err := b.pub.PublishTx(b.ctx, nilTx, ok); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("PublishTx(typed nil tx): %v, want an idemq.ErrConfig", err)
	}
	// Two endpoints: event 1's rows are rows 2 and 3.
	addEndpoint(t, b, "https://a.example", nil)
	addEndpoint(t, b, "https://b.example", nil)
	small, err := outbox.New(b.pool, outbox.Config{MaxPayload: 100})
	if err != nil {
		t.Fatal(err)
	}
	smallPub, err := endpoints.NewPublisher(b.reg, small)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		pub  *endpoints.Publisher
		bad  endpoints.Event
		want string
	}{
		"key not UTF-8":   {b.pub, endpoints.Event{Type: "a.b", Key: "\xff", Data: []byte(`{}`)}, "invalid event 1: key"},
		"key with NUL":    {b.pub, endpoints.Event{Type: "a.b", Key: "a\x00b", Data: []byte(`{}`)}, "invalid event 1: key"},
		"key too long":    {b.pub, endpoints.Event{Type: "a.b", Key: strings.Repeat("k", endpoints.MaxEventKeyLen+1), Data: []byte(`{}`)}, "invalid event 1: key"},
		"payload too big": {smallPub, endpoints.Event{Type: "a.b", Data: []byte(`{"pad":"` + strings.Repeat("x", 200) + `"}`)}, "invalid event 1 (its row to endpoint"},
	} {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := tc.pub.PublishTx(b.ctx, tx, event("k", 0), tc.bad)
			return err
		})
		if !errors.Is(err, endpoints.ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidEvent naming %q", name, err, tc.want)
		}
	}
	if n := pending(t, b); n != 0 {
		t.Fatalf("%d rows written by refused calls, want none", n)
	}
	long := endpoints.Event{Type: "a.b", Key: strings.Repeat("k", endpoints.MaxEventKeyLen), Data: []byte(`{}`)}
	if n := publish(t, b, long); n != 2 {
		t.Fatalf("a key of MaxEventKeyLen bytes: %d rows, want 2", n)
	}
}

// nilTxType gives a typed nil pgx.Tx.
type nilTxType struct{ pgx.Tx }

// TestBadInputEndpoint: NaN and infinite rate limits, a timeout below the
// stored unit of 1 ms, a whsk_ key whose public half is another key's,
// and a bad Schema (blamed on Schema, not Table) are refused.
func TestBadInputEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A 64-byte whsk_ key is seed || public key: splice two keys' halves.
	seed := func(k string) []byte {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(k, signing.PrivateKeyPrefix))
		if err != nil || len(raw) != ed25519.SeedSize {
			t.Fatalf("NewSigningKey gave %d bytes (%v), want a seed of %d", len(raw), err, ed25519.SeedSize)
		}
		return raw
	}
	priv1, _ := signing.NewSigningKey()
	priv2, _ := signing.NewSigningKey()
	full1, full2 := ed25519.NewKeyFromSeed(seed(priv1)), ed25519.NewKeyFromSeed(seed(priv2))
	genuine := signing.PrivateKeyPrefix + base64.StdEncoding.EncodeToString(full1)
	spliced := signing.PrivateKeyPrefix + base64.StdEncoding.EncodeToString(append(full1[:ed25519.SeedSize:ed25519.SeedSize], full2[ed25519.SeedSize:]...))
	if _, err := signing.ParseKey(spliced); !errors.Is(err, signing.ErrInvalidSigningKey) {
		t.Errorf("ParseKey(spliced whsk_): %v, want ErrInvalidSigningKey", err)
	}
	if _, err := signing.ParseKey(genuine); err != nil {
		t.Errorf("ParseKey(genuine 64-byte whsk_): %v", err)
	}
	for name, tweak := range map[string]func(*endpoints.Endpoint){
		"RateLimit NaN":        func(e *endpoints.Endpoint) { e.RateLimit = math.NaN() },
		"RateLimit +Inf":       func(e *endpoints.Endpoint) { e.RateLimit = math.Inf(1) },
		"RateLimit -Inf":       func(e *endpoints.Endpoint) { e.RateLimit = math.Inf(-1) },
		"Timeout 500µs":        func(e *endpoints.Endpoint) { e.Timeout = 500 * time.Microsecond },
		"spliced whsk_ key":    func(e *endpoints.Endpoint) { e.Keys = []string{spliced} },
		"Timeout 1ns":          func(e *endpoints.Endpoint) { e.Timeout = time.Nanosecond },
		"negative RateLimit":   func(e *endpoints.Endpoint) { e.RateLimit = -1 },
		"negative Timeout":     func(e *endpoints.Endpoint) { e.Timeout = -time.Second },
		"negative Concurrency": func(e *endpoints.Endpoint) { e.Concurrency = -1 },
	} {
		ep := endpoints.Endpoint{URL: "https://example.com", Keys: []string{signing.NewSecret()}}
		tweak(&ep)
		if _, err := b.reg.Add(b.ctx, ep); err == nil {
			t.Errorf("%s: Add accepted it", name)
		}
	}
	ep := addEndpoint(t, b, "https://example.com", func(e *endpoints.Endpoint) { e.Timeout = time.Millisecond })
	if got, err := b.reg.Get(b.ctx, ep.ID); err != nil || got.Timeout != time.Millisecond {
		t.Fatalf("Timeout of 1ms stored as %v (%v)", got.Timeout, err)
	}
	for field, cfg := range map[string]endpoints.RegistryConfig{"Schema": {Schema: "1x"}, "Table": {Table: "Bad-Name"}} {
		_, err := endpoints.NewRegistry(b.pool, cfg)
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("RegistryConfig %+v: %v, want a ConfigError on %s", cfg, err, field)
		}
	}
}

// TestBadInputRegistryNotMigrated (issue 27 §14): every registry call and the
// fan-out, on a database without the registry's tables or with a table
// older than the code, returns ErrNotMigrated, whose text names what is
// missing and the command that creates it, instead of a raw 42P01/42703.
func TestBadInputRegistryNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, reg *endpoints.Registry, pool *pgxpool.Pool) {
		t.Helper()
		ob, err := outbox.New(pool, outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := endpoints.NewPublisher(reg, ob)
		if err != nil {
			t.Fatal(err)
		}
		ep := endpoints.Endpoint{ID: "partner", URL: "https://example.com", Keys: []string{signing.NewSecret()}}
		for name, call := range map[string]func() error{
			"Add":           func() error { _, err := reg.Add(ctx, ep); return err },
			"Get":           func() error { _, err := reg.Get(ctx, ep.ID); return err },
			"List":          func() error { _, err := reg.List(ctx); return err },
			"Update":        func() error { return reg.Update(ctx, ep) },
			"RotateKey":     func() error { return reg.RotateKey(ctx, ep.ID, signing.NewSecret(), time.Minute) },
			"Disable":       func() error { return reg.Disable(ctx, ep.ID, "x") },
			"Enable":        func() error { return reg.Enable(ctx, ep.ID) },
			"Remove":        func() error { return reg.Remove(ctx, ep.ID) },
			"MarkFailing":   func() error { _, err := reg.MarkFailing(ctx, ep.ID); return err },
			"MarkSucceeded": func() error { return reg.MarkSucceeded(ctx, ep.ID) },
			"ReportBreaker": func() error {
				return reg.ReportBreaker(ctx, ep.ID, endpoints.BreakerOpen, time.Now(), "relay-1")
			},
			"PublishTx": func() error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := pub.PublishTx(ctx, tx, endpoints.Event{Type: "a.b", Data: []byte(`{}`)})
					return err
				})
			},
		} {
			err := call()
			if !errors.Is(err, endpoints.ErrNotMigrated) || !strings.Contains(err.Error(), "idemq migrate --components webhook") {
				t.Errorf("%s: %v, want ErrNotMigrated naming `idemq migrate --components webhook`", name, err)
			}
		}
	}
	t.Run("no tables", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, reg, pool)
	})
	t.Run("no schema", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{Schema: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		check(t, reg, pool)
	})
	t.Run("table older than the code", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// What the first migration made, before the breaker columns.
		if _, err := b.pool.Exec(ctx, `ALTER TABLE idemq_webhook_endpoints DROP COLUMN breaker_state, DROP COLUMN breaker_since, DROP COLUMN breaker_relay`); err != nil {
			t.Fatal(err)
		}
		reg, err := endpoints.NewRegistry(b.pool, endpoints.RegistryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		// Calls that touch no breaker column work on such a table; the
		// reads and the breaker's report do not.
		for name, call := range map[string]func() error{
			"List":          func() error { _, err := reg.List(ctx); return err },
			"ReportBreaker": func() error { return reg.ReportBreaker(ctx, "x", endpoints.BreakerOpen, time.Now(), "relay-1") },
		} {
			if err := call(); !errors.Is(err, endpoints.ErrNotMigrated) {
				t.Errorf("%s: %v, want ErrNotMigrated", name, err)
			}
		}
	})
}
