package webhook_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook"
)

// The bad-input suite of the webhook package (issue 23): every careless
// value gets an error that says what to do, and nothing panics.

// TestBadInputReceiverConfig: a receiver without a consumer or keys, or
// with a tolerance below the timestamp's unit, and a leased consumer with
// a lease of 1 ns are refused with ErrConfig.
func TestBadInputReceiverConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := webhook.NewSecret()
	c, err := consumer.New(b.pool, "webhook", webhook.Handle(func(context.Context, pgx.Tx, webhook.Delivery) error { return nil }), consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		c   *consumer.Consumer
		cfg webhook.ReceiverConfig
	}{
		"nil consumer":       {nil, webhook.ReceiverConfig{Keys: []string{secret}}},
		"no keys":            {c, webhook.ReceiverConfig{}},
		"bad key":            {c, webhook.ReceiverConfig{Keys: []string{"whsec_short"}}},
		"tolerance of 500ms": {c, webhook.ReceiverConfig{Keys: []string{secret}, Tolerance: 500 * time.Millisecond}},
		"negative MaxBody":   {c, webhook.ReceiverConfig{Keys: []string{secret}, MaxBody: -1}},
	} {
		if _, err := webhook.NewReceiver(tc.c, tc.cfg); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	// Issue 23 item 4: a lease of 1 ns was accepted and one webhook applied
	// two or three times.
	leased := webhook.HandleLeased(func(context.Context, webhook.Delivery, idemq.Lease) error { return nil })
	_, err = consumer.NewLeased(b.pool, "webhook", leased, consumer.Config{LeaseTTL: time.Nanosecond})
	var ce *idemq.ConfigError
	if !errors.As(err, &ce) || ce.Field != "LeaseTTL" {
		t.Fatalf("LeaseTTL of 1ns: %v, want a ConfigError on LeaseTTL", err)
	}
}

// TestBadInputWebhookID: a correctly signed webhook whose id the inbox
// cannot take (over its key limit, not UTF-8) gets 400 with
// "webhook-delivery: abort-message" and records nothing; one without an
// id gets 401.
func TestBadInputWebhookID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := webhook.NewSecret()
	keys, _ := webhook.ParseKeys(secret)
	srv := httptest.NewServer(newWebhookReceiver(t, b, secret, func(context.Context, pgx.Tx, webhook.Delivery) error {
		t.Error("the handler ran for an unusable id")
		return nil
	}))
	t.Cleanup(srv.Close)
	now := time.Now()
	for name, id := range map[string]string{"oversized": strings.Repeat("x", 2000), "not UTF-8": "\xff\xfe"} {
		resp := postSigned(t, srv.URL, id, now, webhook.Sign(keys, id, now, []byte(`{}`)), `{}`)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(webhook.HeaderDelivery) != webhook.AbortMessage {
			t.Errorf("%s id: %d, %q; want 400 with abort-message", name, resp.StatusCode, resp.Header.Get(webhook.HeaderDelivery))
		}
	}
	if resp := postSigned(t, srv.URL, "", now, webhook.Sign(keys, "", now, []byte(`{}`)), `{}`); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no id: %d, want 401", resp.StatusCode)
	}
	var records int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idemq_inbox`).Scan(&records); err != nil || records != 0 {
		t.Fatalf("%d inbox records (%v), want none", records, err)
	}
}

// TestBadInputHandlerEndsTheTransaction: a handler that commits the
// Receiver's transaction is refused as the consumer refuses such handlers:
// its Commit fails, returning that error rolls its writes back and
// answers 503, and the next delivery applies the webhook once.
func TestBadInputHandlerEndsTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE paid (invoice text)`); err != nil {
		t.Fatal(err)
	}
	secret := webhook.NewSecret()
	keys, _ := webhook.ParseKeys(secret)
	var commitErr error
	calls := 0
	srv := httptest.NewServer(newWebhookReceiver(t, b, secret, func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		calls++
		if _, err := tx.Exec(ctx, `INSERT INTO paid VALUES ('inv_1')`); err != nil {
			return err
		}
		if calls == 1 {
			commitErr = tx.Commit(ctx)
			return commitErr
		}
		return nil
	}))
	t.Cleanup(srv.Close)
	post := func() int {
		now := time.Now()
		return postSigned(t, srv.URL, "m1", now, webhook.Sign(keys, "m1", now, []byte(`{}`)), `{}`).StatusCode
	}
	if got := post(); got != http.StatusServiceUnavailable || commitErr == nil || !strings.Contains(commitErr.Error(), "must not commit") {
		t.Fatalf("handler that commits: status %d, Commit returned %v; want 503 and a refusal", got, commitErr)
	}
	for range 2 {
		if got := post(); got != http.StatusOK {
			t.Fatalf("redelivery: status %d, want 200", got)
		}
	}
	var paid int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM paid`).Scan(&paid); err != nil || paid != 1 {
		t.Fatalf("%d rows (%v), want the webhook applied once", paid, err)
	}
}

// TestBadInputPublisher: NewPublisher without a registry is an ErrConfig;
// PublishTx with a nil transaction returns an error instead of
// panicking; a bad event key's error names the event (not the outbox row)
// and matches ErrInvalidEvent, as does a payload the outbox refuses.
func TestBadInputPublisher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := webhook.NewPublisher(nil, b.ob); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("NewPublisher(nil, ob): %v, want ErrConfig", err)
	}
	if _, err := webhook.NewPublisher(b.reg, nil); !errors.Is(err, idemq.ErrConfig) {
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
	smallPub, err := webhook.NewPublisher(b.reg, small)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		pub  *webhook.Publisher
		bad  webhook.Event
		want string
	}{
		"key not UTF-8":   {b.pub, webhook.Event{Type: "a.b", Key: "\xff", Data: []byte(`{}`)}, "invalid event 1: key"},
		"key with NUL":    {b.pub, webhook.Event{Type: "a.b", Key: "a\x00b", Data: []byte(`{}`)}, "invalid event 1: key"},
		"key too long":    {b.pub, webhook.Event{Type: "a.b", Key: strings.Repeat("k", webhook.MaxEventKeyLen+1), Data: []byte(`{}`)}, "invalid event 1: key"},
		"payload too big": {smallPub, webhook.Event{Type: "a.b", Data: []byte(`{"pad":"` + strings.Repeat("x", 200) + `"}`)}, "invalid event 1 (its row to endpoint"},
	} {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := tc.pub.PublishTx(b.ctx, tx, event("k", 0), tc.bad)
			return err
		})
		if !errors.Is(err, webhook.ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidEvent naming %q", name, err, tc.want)
		}
	}
	if n, _ := pending(t, b); n != 0 {
		t.Fatalf("%d rows written by refused calls, want none", n)
	}
	long := webhook.Event{Type: "a.b", Key: strings.Repeat("k", webhook.MaxEventKeyLen), Data: []byte(`{}`)}
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
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(k, webhook.PrivateKeyPrefix))
		if err != nil || len(raw) != ed25519.SeedSize {
			t.Fatalf("NewSigningKey gave %d bytes (%v), want a seed of %d", len(raw), err, ed25519.SeedSize)
		}
		return raw
	}
	priv1, _ := webhook.NewSigningKey()
	priv2, _ := webhook.NewSigningKey()
	full1, full2 := ed25519.NewKeyFromSeed(seed(priv1)), ed25519.NewKeyFromSeed(seed(priv2))
	genuine := webhook.PrivateKeyPrefix + base64.StdEncoding.EncodeToString(full1)
	spliced := webhook.PrivateKeyPrefix + base64.StdEncoding.EncodeToString(append(full1[:ed25519.SeedSize:ed25519.SeedSize], full2[ed25519.SeedSize:]...))
	if _, err := webhook.ParseKey(spliced); !errors.Is(err, webhook.ErrInvalidKey) {
		t.Errorf("ParseKey(spliced whsk_): %v, want ErrInvalidKey", err)
	}
	if _, err := webhook.ParseKey(genuine); err != nil {
		t.Errorf("ParseKey(genuine 64-byte whsk_): %v", err)
	}
	for name, tweak := range map[string]func(*webhook.Endpoint){
		"RateLimit NaN":        func(e *webhook.Endpoint) { e.RateLimit = math.NaN() },
		"RateLimit +Inf":       func(e *webhook.Endpoint) { e.RateLimit = math.Inf(1) },
		"RateLimit -Inf":       func(e *webhook.Endpoint) { e.RateLimit = math.Inf(-1) },
		"Timeout 500µs":        func(e *webhook.Endpoint) { e.Timeout = 500 * time.Microsecond },
		"spliced whsk_ key":    func(e *webhook.Endpoint) { e.Keys = []string{spliced} },
		"Timeout 1ns":          func(e *webhook.Endpoint) { e.Timeout = time.Nanosecond },
		"negative RateLimit":   func(e *webhook.Endpoint) { e.RateLimit = -1 },
		"negative Timeout":     func(e *webhook.Endpoint) { e.Timeout = -time.Second },
		"negative Concurrency": func(e *webhook.Endpoint) { e.Concurrency = -1 },
	} {
		ep := webhook.Endpoint{URL: "https://example.com", Keys: []string{webhook.NewSecret()}}
		tweak(&ep)
		if _, err := b.reg.Add(b.ctx, ep); err == nil {
			t.Errorf("%s: Add accepted it", name)
		}
	}
	ep, _ := addEndpoint(t, b, "https://example.com", func(e *webhook.Endpoint) { e.Timeout = time.Millisecond })
	if got, err := b.reg.Get(b.ctx, ep.ID); err != nil || got.Timeout != time.Millisecond {
		t.Fatalf("Timeout of 1ms stored as %v (%v)", got.Timeout, err)
	}
	for field, cfg := range map[string]webhook.RegistryConfig{"Schema": {Schema: "1x"}, "Table": {Table: "Bad-Name"}} {
		_, err := webhook.NewRegistry(b.pool, cfg)
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("RegistryConfig %+v: %v, want a ConfigError on %s", cfg, err, field)
		}
	}
}

// TestBadInputSSRFRefusalNamesTheSetting: a delivery the SSRF guard
// refuses says which setting lets a private target through.
func TestBadInputSSRFRefusalNamesTheSetting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	target := newReceiver(t, nil) // on 127.0.0.1
	ep, _ := addEndpoint(t, b, target.srv.URL, nil)
	sink, err := webhook.NewSink(b.reg, webhook.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	err = sink.Publish(b.ctx, 0, []relay.Message{{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: webhook.DestinationPrefix + ep.ID, Payload: []byte(`{}`)}}})
	if err == nil || !strings.Contains(err.Error(), "AllowedNetworks") || !strings.Contains(err.Error(), "--webhook-allow-network") {
		t.Fatalf("refused delivery: %v, want the error to name AllowedNetworks and --webhook-allow-network", err)
	}
	if target.count() != 0 {
		t.Fatal("the guarded receiver was reached")
	}
}
