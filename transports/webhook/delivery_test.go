package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// TestRetriedUntilDeliveredAppliedOnce: the receiver, built with the
// middleware, fails twice with 500 and Retry-After, then applies the
// message. The relay waits at least the Retry-After, and the handler runs
// once.
func TestRetriedUntilDeliveredAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var applied, failures atomic.Int64
	secret := signing.NewSecret()
	app := newWebhookReceiver(t, b, secret, func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		applied.Add(1)
		return nil
	})
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		if failures.Add(1) <= 2 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusInternalServerError)
			return true
		}
		app.ServeHTTP(w, r)
		return true
	})
	if _, err := b.reg.Add(b.ctx, endpoints.Endpoint{ID: "ep", URL: rc.srv.URL, Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var delays []time.Duration
	runRelay(t, b, fastSink(t, b, webhook.Config{}), relay.Config{Hooks: relay.Hooks{
		OnRetried: func(e relay.RetriedEvent) { mu.Lock(); delays = append(delays, e.Delay); mu.Unlock() },
	}})
	publish(t, b, event("k", 1))
	idemqtest.WaitFor(t, "the delivery", func() bool { n, _ := pending(t, b); return applied.Load() == 1 && n == 0 })
	hits := rc.all()
	if len(hits) != 3 || hits[0].id != hits[2].id {
		t.Fatalf("%d requests, want 3 with one webhook-id", len(hits))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(delays) != 2 || delays[0] < time.Second || delays[1] < time.Second {
		t.Fatalf("retry delays %v: want two of at least the 1 s Retry-After", delays)
	}
	if hits[0].header.Get(signing.HeaderTimestamp) == "" || hits[0].header.Get(webhook.HeaderIdempotencyKey) != hits[0].id {
		t.Fatalf("headers %v: want webhook-timestamp and Idempotency-Key = webhook-id", hits[0].header)
	}
	// A later duplicate (a relay that crashed after the POST) is
	// acknowledged without running the handler.
	dup, _ := http.NewRequest(http.MethodPost, rc.srv.URL, strings.NewReader(string(hits[2].body)))
	dup.Header = hits[2].header.Clone()
	resp, err := http.DefaultClient.Do(dup)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || applied.Load() != 1 {
		t.Fatalf("duplicate: status %d, applied %d times; want 200 and once", resp.StatusCode, applied.Load())
	}
}

// TestBadRequestIsADeadLetter: a 400 is permanent: one request, then a
// dead letter that keeps the status and the start of the body.
func TestBadRequestIsADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "field amount is missing"+strings.Repeat(" and more", 200), http.StatusBadRequest)
		return true
	})
	addEndpoint(t, b, rc.srv.URL, nil)
	runRelay(t, b, fastSink(t, b, webhook.Config{ErrorBody: 64}), relay.Config{})
	publish(t, b, event("k", 1))
	var dead []outbox.DeadLetter
	idemqtest.WaitFor(t, "the dead letter", func() bool {
		var err error
		dead, err = b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) == 1
	})
	if rc.count() != 1 {
		t.Fatalf("%d requests, want 1", rc.count())
	}
	if e := dead[0].LastError; !strings.Contains(e, "HTTP 400") || !strings.Contains(e, "field amount is missing") || len(e) > 200 {
		t.Fatalf("dead letter error %q: want the status and the first 64 bytes of the body", e)
	}
}

// TestGoneDisablesTheEndpointAndHoldsItsRows: a 410 disables the endpoint;
// its rows wait without burning attempts, and flow in key order once it is
// enabled again. Another endpoint is served meanwhile.
func TestGoneDisablesTheEndpointAndHoldsItsRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc, gone := failingReceiver(t, http.StatusGone)
	other := newReceiver(t, nil)
	ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
	addEndpoint(t, b, other.srv.URL, nil)
	var disabled atomic.Int64
	sink := fastSink(t, b, webhook.Config{Hooks: webhook.Hooks{OnDisabled: func(webhook.DisabledEvent) { disabled.Add(1) }}})
	runRelay(t, b, sink, relay.Config{})
	// One transaction: all five rows exist before the first delivery
	// disables the endpoint (fan-out skips disabled endpoints).
	var events []endpoints.Event
	for i := range 5 {
		events = append(events, event("k", i))
	}
	publish(t, b, events...)
	idemqtest.WaitFor(t, "the disable", func() bool { return disabled.Load() == 1 })
	got, err := b.reg.Get(b.ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Enabled() || !strings.Contains(got.DisabledReason, "410") {
		t.Fatalf("endpoint after 410: enabled %v, reason %q", got.Enabled(), got.DisabledReason)
	}
	idemqtest.WaitFor(t, "the other endpoint's deliveries", func() bool { return other.count() == 5 })
	// Events published while disabled are not fanned out to it.
	publish(t, b, event("k", 99))
	idemqtest.WaitFor(t, "the other endpoint's sixth delivery", func() bool { return other.count() == 6 })
	time.Sleep(200 * time.Millisecond) // several hold intervals pass
	rows, attempts := pending(t, b)
	if rc.count() != 1 || rows != 5 || attempts != 0 {
		t.Fatalf("while disabled: %d requests, %d rows pending with %d attempts; want 1, 5, 0", rc.count(), rows, attempts)
	}
	gone.Store(false)
	if err := b.reg.Enable(b.ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "the held rows", func() bool { n, _ := pending(t, b); return n == 0 })
	hits := rc.all()[1:]
	if len(hits) != 5 {
		t.Fatalf("%d deliveries after enabling, want 5", len(hits))
	}
	for i, h := range hits {
		if h.n != i {
			t.Fatalf("delivery %d carries event %d: out of key order", i, h.n)
		}
	}
}

// TestRetryNowSendsHeldRowsAtOnce: with an hour-long HoldInterval,
// RefreshInterval and relay RescanInterval, the rows held while an endpoint was disabled arrive, in
// key order and without lost attempts, as soon as it is enabled and its
// destination retried now.
func TestRetryNowSendsHeldRowsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc, gone := failingReceiver(t, http.StatusGone)
	ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
	sink := fastSink(t, b, webhook.Config{HoldInterval: time.Hour, RefreshInterval: time.Hour})
	runRelay(t, b, sink, relay.Config{RescanInterval: time.Hour})
	publish(t, b, event("k", 0), event("k", 1), event("k", 2))
	idemqtest.WaitFor(t, "the rows held", func() bool {
		var held int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idemq_outbox WHERE available_at > now() + interval '30 minutes' AND attempts = 0`).Scan(&held)
		return err == nil && held == 3
	})
	gone.Store(false)
	if err := b.reg.Enable(b.ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := b.ob.RetryNow(b.ctx, endpoints.DestinationPrefix+ep.ID); err != nil || n != 3 {
		t.Fatalf("RetryNow = %d, %v; want 3", n, err)
	}
	idemqtest.WaitFor(t, "the held rows", func() bool { n, _ := pending(t, b); return n == 0 })
	hits := rc.all()[1:]
	if len(hits) != 3 || hits[0].n != 0 || hits[1].n != 1 || hits[2].n != 2 {
		t.Fatalf("deliveries after enabling %+v, want events 0, 1, 2", hits)
	}
}

// failingReceiver answers status until down is set to false.
func failingReceiver(t *testing.T, status int) (rc *receiver, down *atomic.Bool) {
	down = new(atomic.Bool)
	down.Store(true)
	rc = newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		if down.Load() {
			http.Error(w, "down", status)
			return true
		}
		return false
	})
	return rc, down
}

// TestHangingEndpointDoesNotStallOthers: an endpoint that never answers
// times out, its breaker opens and holds its rows out of the batches, so a
// healthy endpoint receives everything while the hanging one gets few
// requests and its rows lose no attempts to the breaker.
func TestHangingEndpointDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	hanging := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	})
	t.Cleanup(func() { close(release) })
	healthy := newReceiver(t, nil)
	slow, _ := addEndpoint(t, b, hanging.srv.URL, func(e *endpoints.Endpoint) { e.Timeout = 100 * time.Millisecond; e.Concurrency = 2 })
	fine, _ := addEndpoint(t, b, healthy.srv.URL, nil)
	sink := fastSink(t, b, webhook.Config{BreakerFailures: 2, BreakerCooldown: time.Hour})
	runRelay(t, b, sink, relay.Config{BatchSize: 20})
	const n = 200
	for i := range n {
		publish(t, b, event("", i))
	}
	idemqtest.WaitFor(t, "the healthy endpoint's deliveries", func() bool { rows, _ := pendingFor(t, b, fine.ID); return rows == 0 })
	rows, attempts := pendingFor(t, b, slow.ID)
	if healthy.count() != n || hanging.count() > 4 || rows != n || attempts > 4 {
		t.Fatalf("healthy endpoint: %d requests, want %d; hanging endpoint: %d requests, %d rows pending with %d attempts; want at most 4 requests before the breaker opened, %d rows, at most 4 attempts",
			healthy.count(), n, hanging.count(), rows, attempts, n)
	}
}

// TestConsistentFailureDisables: an endpoint that fails for DisableAfter
// without a success is disabled with a reason, and its rows are held.
func TestConsistentFailureDisables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return true
	})
	ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
	var disabled atomic.Pointer[webhook.DisabledEvent]
	sink := fastSink(t, b, webhook.Config{DisableAfter: 300 * time.Millisecond, BreakerFailures: 1000,
		Hooks: webhook.Hooks{OnDisabled: func(e webhook.DisabledEvent) { disabled.Store(&e) }}})
	runRelay(t, b, sink, relay.Config{Retry: idemq.Retry{MaxAttempts: 1000}})
	publish(t, b, event("k", 1))
	idemqtest.WaitFor(t, "the disable", func() bool { return disabled.Load() != nil })
	got, err := b.reg.Get(b.ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Enabled() || !strings.Contains(got.DisabledReason, "failing since") || got.FailingSince.IsZero() {
		t.Fatalf("endpoint %+v: want disabled for failing, with its failure clock", got)
	}
	if rows, _ := pending(t, b); rows != 1 {
		t.Fatalf("%d rows pending, want the held one", rows)
	}
	if err := b.reg.Enable(b.ctx, ep.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.reg.Get(b.ctx, ep.ID); !got.FailingSince.IsZero() {
		t.Fatal("Enable kept the failure clock running")
	}
}

// TestBreakerProbesAndRecovers: the breaker opens after failures, holds the
// rows without burning attempts, probes after the cooldown and, once the
// endpoint answers again, lets every row through in key order.
func TestBreakerProbesAndRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc, down := failingReceiver(t, http.StatusBadGateway)
	addEndpoint(t, b, rc.srv.URL, nil)
	var held atomic.Int64
	var logs testenv.Logs
	runRelay(t, b, fastSink(t, b, webhook.Config{BreakerFailures: 2, BreakerCooldown: 100 * time.Millisecond, Logger: logs.Logger()}),
		relay.Config{Retry: idemq.Retry{MaxAttempts: 1000}, Hooks: relay.Hooks{OnHeld: func(e relay.HeldEvent) {
			if errors.Is(e.Err, webhook.ErrHeld) {
				held.Add(1)
			}
		}}})
	for i := range 10 {
		publish(t, b, event("k", i))
	}
	idemqtest.WaitFor(t, "rows held by the open breaker", func() bool { return held.Load() > 0 })
	down.Store(false)
	idemqtest.WaitFor(t, "every delivery", func() bool { n, _ := pending(t, b); return n == 0 })
	var ok []int
	for _, h := range rc.all() {
		if len(ok) == 0 || h.n != ok[len(ok)-1] {
			ok = append(ok, h.n)
		}
	}
	for i, n := range ok {
		if n != i {
			t.Fatalf("events in arrival order %v: want 0..9 in key order", ok)
		}
	}
	// The breaker's changes are logged once each, not once per row.
	if n := len(logs.Records("webhook: breaker open:")); n != 1 {
		t.Errorf("%d lines for the breaker opening, want 1", n)
	}
	if n := len(logs.Records("webhook: breaker closed")); n != 1 {
		t.Errorf("%d lines for the breaker closing, want 1", n)
	}
	probes, reopened := len(logs.Records("webhook: breaker half-open")), len(logs.Records("webhook: breaker open again"))
	if probes == 0 || reopened != probes-1 {
		t.Errorf("%d probes logged and %d re-openings, want at least one probe and one re-opening per failed probe", probes, reopened)
	}
}

// TestRateLimitHoldsWithoutAttempts: deliveries over an endpoint's rate
// limit are held back (not sent, no attempt) and delivered later, once
// each.
func TestRateLimitHoldsWithoutAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, nil)
	addEndpoint(t, b, rc.srv.URL, func(e *endpoints.Endpoint) { e.RateLimit = 20 })
	var held, retried atomic.Int64
	runRelay(t, b, fastSink(t, b, webhook.Config{}), relay.Config{Hooks: relay.Hooks{
		OnHeld: func(e relay.HeldEvent) {
			if errors.Is(e.Err, webhook.ErrHeld) {
				held.Add(1)
			}
		},
		OnRetried: func(relay.RetriedEvent) { retried.Add(1) },
	}})
	var events []endpoints.Event
	for i := range 60 {
		events = append(events, event("", i))
	}
	publish(t, b, events...)
	idemqtest.WaitFor(t, "every delivery", func() bool { n, _ := pending(t, b); return n == 0 })
	if rc.count() != 60 || held.Load() == 0 || retried.Load() != 0 {
		t.Fatalf("%d requests, %d held, %d retried: want 60 requests, some held, no attempt spent", rc.count(), held.Load(), retried.Load())
	}
}

// TestConcurrencyBound: an endpoint never has more deliveries in flight
// than its Concurrency, across the relay's workers.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var inFlight, most atomic.Int64
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(10 * time.Millisecond)
		return false
	})
	addEndpoint(t, b, rc.srv.URL, func(e *endpoints.Endpoint) { e.Concurrency = 2 })
	runRelay(t, b, fastSink(t, b, webhook.Config{}), relay.Config{Workers: 3})
	var events []endpoints.Event
	for i := range 40 {
		events = append(events, event("", i))
	}
	publish(t, b, events...)
	idemqtest.WaitFor(t, "every delivery", func() bool { n, _ := pending(t, b); return n == 0 })
	if rc.count() != 40 || most.Load() > 2 {
		t.Fatalf("%d requests, at most %d at once; want 40, at most 2", rc.count(), most.Load())
	}
}

// TestFailingEndpointLoggedAsSuch (issue 27 §20): the relay's line for a
// webhook endpoint that fails names the destination failing and the
// endpoint's error, not a "broker outage", and says when it recovers.
func TestFailingEndpointLoggedAsSuch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc, down := failingReceiver(t, http.StatusServiceUnavailable)
	ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
	var logs testenv.Logs
	runRelay(t, b, fastSink(t, b, webhook.Config{BreakerFailures: 1000}), relay.Config{Logger: logs.Logger(), Retry: idemq.Retry{MaxAttempts: 1000}})
	publish(t, b, event("k", 0))
	dest := endpoints.DestinationPrefix + ep.ID
	idemqtest.WaitFor(t, "the failing destination logged", func() bool { return len(logs.Records("relay: destination failing:", "destination", dest)) > 0 })
	down.Store(false)
	idemqtest.WaitFor(t, "its recovery logged", func() bool { return len(logs.Records("relay: destination failing no more", "destination", dest)) > 0 })
	if got := logs.Records("relay: destination failing:"); len(got) != 1 || !strings.Contains(got[0].Attrs["err"], "endpoint "+ep.ID+": HTTP 503") {
		t.Errorf("failing lines %v, want one whose err is the endpoint's HTTP 503", got)
	}
	for _, r := range logs.Records("") {
		if strings.Contains(r.Msg, "broker outage") {
			t.Errorf("a failing webhook endpoint logged as %q", r.Msg)
		}
	}
}
