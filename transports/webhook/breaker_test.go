package webhook_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// TestBreakerRecordedInRegistry: the Sink records each change of an
// endpoint's breaker on its registry row. An endpoint answering 500 opens
// it (with when and by which relay); once it answers again the probe runs
// while the row says half-open, and its success is recorded as closed. An
// endpoint that never fails has no breaker report at all.
func TestBreakerRecordedInRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var down atomic.Bool
	down.Store(true)
	var probed, sawHalfOpen atomic.Bool
	var ep endpoints.Endpoint
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		if down.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return true
		}
		if probed.Swap(true) {
			return false
		}
		// Recovered: the first request is the probe. Answer once the
		// registry says half-open, so the test sees the state the probe
		// runs in.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if got, err := b.reg.Get(b.ctx, ep.ID); err == nil && got.Breaker == endpoints.BreakerHalfOpen {
				sawHalfOpen.Store(true)
				break
			}
		}
		return false
	})
	ep, _ = addEndpoint(t, b, rc.srv.URL, nil)
	// Count the breaker's writes: one per change of state, none per
	// delivery.
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE breaker_writes (state text);
CREATE FUNCTION breaker_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO breaker_writes VALUES (NEW.breaker_state); RETURN NEW; END $$;
CREATE TRIGGER breaker_write AFTER UPDATE OF breaker_state ON idemq_webhook_endpoints FOR EACH ROW EXECUTE FUNCTION breaker_write()`); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Logs
	healthy := newReceiver(t, nil)
	ok, _ := addEndpoint(t, b, healthy.srv.URL, nil)
	start := time.Now()
	runRelay(t, b, fastSink(t, b, webhook.Config{BreakerFailures: 2, BreakerCooldown: 50 * time.Millisecond, Instance: "relay-a", Logger: logs.Logger()}),
		relay.Config{Retry: idemq.Retry{MaxAttempts: 1000}})
	for i := range 5 {
		publish(t, b, event("k", i))
	}

	var open endpoints.Endpoint
	idemqtest.WaitFor(t, "the registry to say open", func() bool {
		open, _ = b.reg.Get(b.ctx, ep.ID)
		return open.Breaker == endpoints.BreakerOpen
	})
	if open.BreakerSince.Before(start.Add(-time.Second)) || open.BreakerSince.After(time.Now()) || open.BreakerRelay != "relay-a" {
		t.Fatalf("open breaker since %v by %q: want a time since the test started, by relay-a", open.BreakerSince, open.BreakerRelay)
	}
	down.Store(false)
	idemqtest.WaitFor(t, "every delivery", func() bool { n, _ := pending(t, b); return n == 0 })
	var closed endpoints.Endpoint
	idemqtest.WaitFor(t, "the registry to say closed", func() bool {
		closed, _ = b.reg.Get(b.ctx, ep.ID)
		return closed.Breaker == endpoints.BreakerClosed
	})
	if !sawHalfOpen.Load() {
		t.Error("the probe ran without the registry saying half-open")
	}
	if !closed.BreakerSince.After(open.BreakerSince) || closed.BreakerRelay != "relay-a" {
		t.Errorf("closed since %v by %q: want after the opening at %v, by relay-a", closed.BreakerSince, closed.BreakerRelay, open.BreakerSince)
	}
	changes := len(logs.Records("webhook: breaker open")) + len(logs.Records("webhook: breaker half-open")) + len(logs.Records("webhook: breaker closed"))
	var writes int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM breaker_writes`).Scan(&writes); err != nil {
		t.Fatal(err)
	}
	if writes == 0 || writes > changes || changes >= rc.count() {
		t.Errorf("%d breaker writes for %d logged changes and %d requests: want at most one write per change", writes, changes, rc.count())
	}
	if got, err := b.reg.Get(b.ctx, ok.ID); err != nil || healthy.count() != 5 || got.Breaker != "" || !got.BreakerSince.IsZero() || got.BreakerRelay != "" {
		t.Errorf("healthy endpoint after %d deliveries: %+v, %v; want no breaker report", healthy.count(), got, err)
	}
}

// TestBreakerWriteFailureFailsNoDelivery: when the registry refuses the
// breaker's report, the Sink logs it and delivers as before: the breaker
// opens and closes, and every row arrives.
func TestBreakerWriteFailureFailsNoDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc, down := failingReceiver(t, http.StatusInternalServerError)
	ep, _ := addEndpoint(t, b, rc.srv.URL, nil)
	if _, err := b.pool.Exec(b.ctx, `CREATE FUNCTION refuse_breaker() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'breaker writes refused'; END $$;
CREATE TRIGGER refuse_breaker BEFORE UPDATE OF breaker_state ON idemq_webhook_endpoints FOR EACH ROW EXECUTE FUNCTION refuse_breaker()`); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Logs
	runRelay(t, b, fastSink(t, b, webhook.Config{BreakerFailures: 2, BreakerCooldown: 50 * time.Millisecond, Logger: logs.Logger()}),
		relay.Config{Retry: idemq.Retry{MaxAttempts: 1000}})
	for i := range 5 {
		publish(t, b, event("k", i))
	}
	idemqtest.WaitFor(t, "a failed breaker write logged", func() bool {
		return len(logs.Records("webhook: recording the breaker's state in the registry failed", "endpoint", ep.ID, "state", "open")) > 0
	})
	down.Store(false)
	idemqtest.WaitFor(t, "every delivery", func() bool { n, _ := pending(t, b); return n == 0 })
	if n := len(logs.Records("webhook: breaker closed")); n != 1 {
		t.Errorf("%d lines for the breaker closing, want 1", n)
	}
	idemqtest.WaitFor(t, "the closing's failed write logged", func() bool {
		return len(logs.Records("webhook: recording the breaker's state in the registry failed", "state", "closed")) > 0
	})
	if got, err := b.reg.Get(b.ctx, ep.ID); err != nil || got.Breaker != "" {
		t.Errorf("endpoint %+v, %v: want no breaker recorded", got, err)
	}
}

// TestBreakerHoldsRowsUntilItHalfOpens (issue 27 §19): an endpoint fails
// for a moment, then recovers. Eight deliveries in flight (the default
// Concurrency) fail together and open the breaker once. The rows it holds
// come back when it half-opens, at most one cooldown later: the failures
// of the deliveries already in flight when it opened do not stretch the
// cooldown (before, each doubled it, up to 16 times), and no backoff is
// added. Their recorded reason names the breaker, not "an earlier message
// of its key failed", although every key is distinct.
func TestBreakerHoldsRowsUntilItHalfOpens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const inFlight, events, cooldown = webhook.ConcurrencyDefault, 20, time.Second
	var arrived atomic.Int64
	outage, probing, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		switch n := arrived.Add(1); {
		case n <= inFlight:
			// The outage: every delivery in flight fails, once all are.
			if n == inFlight {
				close(outage)
			}
			select {
			case <-outage:
			case <-time.After(10 * time.Second):
			}
			http.Error(w, "down for a moment", http.StatusServiceUnavailable)
			return true
		case n == inFlight+1:
			// The first delivery after the outage is the breaker's probe:
			// it succeeds once the test has read the held rows.
			close(probing)
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		return false
	})
	addEndpoint(t, b, rc.srv.URL, nil)
	var mu sync.Mutex
	var holds []relay.HeldEvent
	// One failure opens the breaker, before any slot it frees can send a
	// ninth delivery that the receiver would take for the probe; the
	// other failures in flight land on the open breaker, as the bug had
	// them do.
	runRelay(t, b, fastSink(t, b, webhook.Config{BreakerFailures: 1, BreakerCooldown: cooldown}), relay.Config{Hooks: relay.Hooks{OnHeld: func(e relay.HeldEvent) {
		mu.Lock()
		defer mu.Unlock()
		holds = append(holds, e)
	}}})
	var evs []endpoints.Event
	for i := range events {
		evs = append(evs, event(fmt.Sprintf("k%d", i), i))
	}
	publish(t, b, evs...)

	idemqtest.WaitFor(t, "the breaker's probe", func() bool {
		select {
		case <-probing:
			return true
		default:
			return false
		}
	})
	// The probe runs: the other rows wait in the outbox, unattempted, and
	// say why.
	rows, err := b.pool.Query(b.ctx, `SELECT last_error FROM idemq_outbox WHERE attempts = 0 AND last_error IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(reasons) == 0 {
		t.Fatal("no row held while the breaker probes")
	}
	for _, r := range reasons {
		if !strings.Contains(r, "breaker") || strings.Contains(r, "earlier message") {
			t.Errorf("a held row's recorded reason is %q, want the breaker named and no earlier message of its key", r)
		}
	}
	close(release)
	idemqtest.WaitFor(t, "every delivery", func() bool { n, _ := pending(t, b); return n == 0 })
	if got, want := rc.count(), inFlight+events; got != want {
		t.Errorf("%d requests, want %d: the %d failures of the outage and each event once", got, want, inFlight)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range holds {
		if h.Delay > cooldown {
			t.Errorf("a row held for %v by %q: want at most the cooldown, %v", h.Delay, h.Err, cooldown)
		}
	}
}
