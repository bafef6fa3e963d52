package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// The bad-input suite of the webhook package (issue 23): every careless
// value gets an error that says what to do, and nothing panics.

// TestBadInputReceiverConfig: a receiver without a consumer or keys, or
// with a tolerance below the timestamp's unit, and a leased consumer with
// a lease of 1 ns are refused with ErrConfig.
func TestBadInputReceiverConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := signing.NewSecret()
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
	secret := signing.NewSecret()
	keys, _ := signing.ParseKeys(secret)
	srv := httptest.NewServer(newWebhookReceiver(t, b, secret, func(context.Context, pgx.Tx, webhook.Delivery) error {
		t.Error("the handler ran for an unusable id")
		return nil
	}))
	t.Cleanup(srv.Close)
	now := time.Now()
	for name, id := range map[string]string{"oversized": strings.Repeat("x", 2000), "not UTF-8": "\xff\xfe"} {
		resp := postSigned(t, srv.URL, id, now, signing.Sign(keys, id, now, []byte(`{}`)), `{}`)
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(webhook.HeaderDelivery) != webhook.AbortMessage {
			t.Errorf("%s id: %d, %q; want 400 with abort-message", name, resp.StatusCode, resp.Header.Get(webhook.HeaderDelivery))
		}
	}
	if resp := postSigned(t, srv.URL, "", now, signing.Sign(keys, "", now, []byte(`{}`)), `{}`); resp.StatusCode != http.StatusUnauthorized {
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
	secret := signing.NewSecret()
	keys, _ := signing.ParseKeys(secret)
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
		return postSigned(t, srv.URL, "m1", now, signing.Sign(keys, "m1", now, []byte(`{}`)), `{}`).StatusCode
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

// TestBadInputSinkConfig: a Sink without a registry or with a negative
// setting is refused with ErrConfig.
func TestBadInputSinkConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := webhook.NewSink(nil, webhook.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("nil registry: %v, want ErrConfig", err)
	}
	if _, err := webhook.NewSink(b.reg, webhook.Config{Timeout: -time.Second}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("negative Timeout: %v, want ErrConfig", err)
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
	err = sink.Publish(b.ctx, 0, []relay.Message{{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: endpoints.DestinationPrefix + ep.ID, Payload: []byte(`{}`)}}})
	if err == nil || !strings.Contains(err.Error(), "AllowedNetworks") || !strings.Contains(err.Error(), "--webhook-allow-network") {
		t.Fatalf("refused delivery: %v, want the error to name AllowedNetworks and --webhook-allow-network", err)
	}
	if target.count() != 0 {
		t.Fatal("the guarded receiver was reached")
	}
}

// TestBadInputSinkOnUnmigratedRegistry (issue 27 §14, the Sink's side): a
// Sink whose registry tables are missing holds the rows without an
// attempt, records on each why and how to fix it (`idemq migrate
// --components webhook`), logs it once, and delivers once the registry is
// migrated and the endpoint added, saying so.
func TestBadInputSinkOnUnmigratedRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg, err := endpoints.NewRegistry(b.pool, endpoints.RegistryConfig{Table: "later_endpoints"})
	if err != nil {
		t.Fatal(err)
	}
	unmigrated := b
	unmigrated.reg = reg
	var logs testenv.Logs
	runRelay(t, b, fastSink(t, unmigrated, webhook.Config{Logger: logs.Logger()}), relay.Config{})
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		return b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: endpoints.DestinationPrefix + "partner", Payload: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	const hint = "idemq migrate --components webhook"
	idemqtest.WaitFor(t, "the failed read logged", func() bool { return len(logs.Records("webhook: reading the endpoints failed")) > 0 })
	if got := logs.Records("webhook: reading the endpoints failed")[0]; !strings.Contains(got.Attrs["err"], hint) {
		t.Errorf("logged %v, want the error to say %q", got, hint)
	}
	var attempts int
	var reason string
	idemqtest.WaitFor(t, "the held row's reason", func() bool {
		if err := b.pool.QueryRow(b.ctx, `SELECT attempts, coalesce(last_error, '') FROM idemq_outbox`).Scan(&attempts, &reason); err != nil {
			t.Fatal(err)
		}
		return reason != ""
	})
	if attempts != 0 || !strings.Contains(reason, hint) {
		t.Errorf("held row: %d attempts, reason %q; want none and the reason to say %q", attempts, reason, hint)
	}

	rc := newReceiver(t, nil)
	if err := reg.Migrate(b.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Add(b.ctx, endpoints.Endpoint{ID: "partner", URL: rc.srv.URL, Keys: []string{signing.NewSecret()}}); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "the delivery", func() bool { return rc.count() == 1 })
	idemqtest.WaitFor(t, "the recovery logged", func() bool { return len(logs.Records("webhook: reading the endpoints works again")) > 0 })
	if n := len(logs.Records("webhook: reading the endpoints failed")); n != 1 {
		t.Errorf("%d lines for the failed reads, want 1: once per change, not per batch", n)
	}
}
