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
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/transports/webhook"
)

// TestLeasedReceiver applies webhooks with effects outside Postgres under
// a lease: a failure is retried by the next delivery, a success is applied
// once, a delivery that arrives while another holds the lease gets 503
// with Retry-After, and a permanent failure stays refused.
func TestLeasedReceiver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := webhook.NewSecret()
	recv, err := webhook.NewReceiver(b.inbox, webhook.ReceiverConfig{Keys: []string{secret}, LeaseTTL: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := webhook.ParseKeys(secret)
	var calls, effects atomic.Int64
	inside, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(recv.Leased(func(ctx context.Context, lease inbox.Lease, d webhook.Delivery) error {
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
	}))
	t.Cleanup(srv.Close)
	post := func(id, body string) *http.Response {
		now := time.Now()
		return postSigned(t, srv.URL, id, now, webhook.Sign(keys, id, now, []byte(body)), body)
	}

	if got := post("m1", `{}`).StatusCode; got != http.StatusInternalServerError {
		t.Fatalf("failing handler: %d, want 500", got)
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
		if got := post("m2", `"poison"`).StatusCode; got != http.StatusUnprocessableEntity {
			t.Fatalf("permanent failure: %d, want 422", got)
		}
	}
	if calls.Load() != 3 || effects.Load() != 1 {
		t.Fatalf("handler ran %d times with %d effects; want 3 runs (fail, apply, poison) and 1 effect", calls.Load(), effects.Load())
	}
}
