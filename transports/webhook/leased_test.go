package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// newLeasedReceiver serves a Receiver on a leased consumer of scope
// "webhook" that runs h under leases of ttl, in Redeliver mode.
func newLeasedReceiver(t *testing.T, b bundle, secret string, ttl time.Duration, h webhook.LeasedHandler) *httptest.Server {
	t.Helper()
	c, err := consumer.NewLeased(b.pool, "webhook", webhook.HandleLeased(h), consumer.Config{Redeliver: true, LeaseTTL: ttl, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(receiverOn(t, c, secret))
	t.Cleanup(srv.Close)
	return srv
}

// TestLeasedReceiver applies webhooks with effects outside Postgres under
// a lease: a failure is retried by the next delivery, a success is applied
// once, a delivery that arrives while another holds the lease gets 503
// with Retry-After, and a permanent failure stays refused.
func TestLeasedReceiver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := signing.NewSecret()
	keys, _ := signing.ParseKeys(secret)
	var calls, effects atomic.Int64
	inside, release := make(chan struct{}), make(chan struct{})
	srv := newLeasedReceiver(t, b, secret, time.Hour, func(ctx context.Context, d webhook.Delivery, lease idemq.Lease) error {
		switch calls.Add(1) {
		case 1:
			return errors.New("downstream unavailable")
		case 2:
			close(inside)
			<-release
		}
		if string(d.Body) == `"poison"` {
			return idemq.Permanent(errors.New("cannot apply"))
		}
		effects.Add(1)
		return nil
	})
	post := func(id, body string) *http.Response {
		now := time.Now()
		return postSigned(t, srv.URL, id, now, signing.Sign(keys, id, now, []byte(body)), body)
	}

	if resp := post("m1", `{}`); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("failing handler: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	second := make(chan int)
	go func() { second <- post("m1", `{}`).StatusCode }()
	<-inside
	busy := post("m1", `{}`)
	if busy.StatusCode != http.StatusServiceUnavailable || busy.Header.Get("Retry-After") == "" {
		t.Fatalf("while leased: %d, Retry-After %q; want 503 with Retry-After", busy.StatusCode, busy.Header.Get("Retry-After"))
	}
	close(release)
	if got := <-second; got != http.StatusOK {
		t.Fatalf("retry after the failure: %d, want 200", got)
	}
	if got := post("m1", `{}`).StatusCode; got != http.StatusOK {
		t.Fatalf("duplicate: %d, want 200", got)
	}
	for range 2 {
		resp := post("m2", `"poison"`)
		if resp.StatusCode != http.StatusUnprocessableEntity || resp.Header.Get(webhook.HeaderDelivery) != webhook.AbortMessage {
			t.Fatalf("permanent failure: %d, %s %q; want 422 with abort-message", resp.StatusCode, webhook.HeaderDelivery, resp.Header.Get(webhook.HeaderDelivery))
		}
	}
	if calls.Load() != 3 || effects.Load() != 1 {
		t.Fatalf("handler ran %d times with %d effects; want 3 runs (fail, apply, poison) and 1 effect", calls.Load(), effects.Load())
	}
	rec, err := b.inbox.Get(b.ctx, "webhook", "m1")
	if err != nil || rec.Failures != 1 || rec.Status != inbox.Succeeded {
		t.Fatalf("record of m1: %+v, %v; want SUCCEEDED after 1 counted failure", rec, err)
	}
}

// TestLeasedReceiverRenewsItsLease: a handler that runs longer than its
// 200 ms lease keeps the webhook-id, because the consumer renews the lease
// while it runs: a redelivery that arrives after the first lease would
// have run out gets 503 and the handler runs once (issue 23, item 4: it
// ran twice).
func TestLeasedReceiverRenewsItsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := signing.NewSecret()
	keys, _ := signing.ParseKeys(secret)
	var calls atomic.Int64
	inside, release := make(chan struct{}), make(chan struct{})
	srv := newLeasedReceiver(t, b, secret, 200*time.Millisecond, func(ctx context.Context, d webhook.Delivery, lease idemq.Lease) error {
		if calls.Add(1) == 1 {
			close(inside)
			select {
			case <-release:
			case <-ctx.Done(): // the lease was lost
				return ctx.Err()
			}
		}
		return nil
	})
	post := func() *http.Response {
		now := time.Now()
		return postSigned(t, srv.URL, "slow", now, signing.Sign(keys, "slow", now, []byte(`{}`)), `{}`)
	}
	first := make(chan int)
	go func() { first <- post().StatusCode }()
	<-inside
	rec, err := b.inbox.Get(b.ctx, "webhook", "slow")
	if err != nil {
		t.Fatal(err)
	}
	firstUntil := rec.LeaseUntil
	idemqtest.WaitFor(t, "the first lease's deadline to pass", func() bool { return time.Now().After(firstUntil.Add(100 * time.Millisecond)) })
	if busy := post(); busy.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("redelivery past the first lease: %d, want 503 (the lease renewed)", busy.StatusCode)
	}
	close(release)
	if got := <-first; got != http.StatusOK {
		t.Fatalf("the slow delivery: %d, want 200", got)
	}
	if got := post().StatusCode; got != http.StatusOK {
		t.Fatalf("duplicate: %d, want 200", got)
	}
	if calls.Load() != 1 {
		t.Fatalf("the handler ran %d times, want once", calls.Load())
	}
}
