package webhook

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// endpointState is the Sink's copy of one endpoint and its runtime state.
type endpointState struct {
	mu      sync.Mutex
	ep      endpoints.Endpoint
	keys    []signing.Key
	loaded  time.Time
	sem     chan struct{}
	limiter *rate.Limiter
	// breaker
	failures  int // consecutive retryable failures
	trips     int // times opened since the last success
	openUntil time.Time
	probing   bool
	// the breaker's state as reported to the registry: the latest change,
	// whether it still has to be written, and whether a writer runs
	reported  endpoints.BreakerState
	changedAt time.Time
	unwritten bool
	writing   bool
}

// maxTrips caps the doubling of the breaker's cooldown at 2^6: 5m20s on
// the default cooldown, near the relay's longest backoff.
const maxTrips = 6

// probeHold is how long a row waits while its endpoint's breaker probes,
// at most: the probe's answer decides whether it flows or waits for the
// next cooldown.
const probeHold = time.Second

func (st *endpointState) loadedAt() time.Time {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.loaded
}

func (st *endpointState) disabled() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return !st.ep.Enabled()
}

// refresh installs a fresh read of the endpoint, keeping the breaker.
func (st *endpointState) refresh(ep endpoints.Endpoint, cfg Config, now time.Time) {
	keys, err := signing.ParseKeys(ep.Keys...)
	if err != nil {
		keys = nil // refused at delivery; Add and RotateKey validate keys
	}
	conc := cmp.Or(ep.Concurrency, cfg.Concurrency)
	limit := rate.Inf
	if ep.RateLimit > 0 {
		limit = rate.Limit(ep.RateLimit)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.ep, st.keys, st.loaded = ep, keys, now
	if st.sem == nil || cap(st.sem) != conc {
		st.sem = make(chan struct{}, conc)
	}
	burst := max(1, int(math.Ceil(ep.RateLimit)))
	if st.limiter == nil {
		st.limiter = rate.NewLimiter(limit, burst)
	} else if st.limiter.Limit() != limit || st.limiter.Burst() != burst {
		st.limiter.SetLimit(limit)
		st.limiter.SetBurst(burst)
	}
}

func (st *endpointState) slots() chan struct{} {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sem
}

// admit decides whether m may be sent now: nil, or a hold error.
func (s *Sink) admit(st *endpointState, now time.Time) (endpoints.Endpoint, []signing.Key, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	ep := st.ep
	switch {
	case !ep.Enabled():
		return ep, nil, hold(s.cfg.HoldInterval, "endpoint %s disabled: %s", ep.ID, ep.DisabledReason)
	case now.Before(st.openUntil):
		// Back when the breaker half-opens, not later: the rows wait for
		// the breaker, nothing else.
		wait := st.openUntil.Sub(now)
		return ep, nil, hold(wait, "endpoint %s: breaker open after %d failures in a row; due again when it half-opens in %v",
			ep.ID, st.failures, wait.Round(time.Millisecond))
	case st.probing:
		// The probe usually answers within milliseconds: look again soon
		// rather than a whole cooldown later.
		return ep, nil, hold(min(s.cfg.BreakerCooldown, probeHold), "endpoint %s: breaker half-open; held while one delivery probes the endpoint", ep.ID)
	case !st.openUntil.IsZero():
		st.probing = true // half open: this delivery is the probe
		s.log.Info("webhook: breaker half-open: probing the endpoint with one delivery", "endpoint", ep.ID)
		if st.changed(endpoints.BreakerHalfOpen, now) {
			s.report(st) // its goroutine waits for st.mu
		}
	}
	if len(st.keys) == 0 {
		return ep, nil, idemq.Permanent(fmt.Errorf("webhook: endpoint %s has no valid signing key", ep.ID))
	}
	return ep, st.keys, nil
}

// settle updates the endpoint's breaker and failure clock after a
// delivery that ended with cause, and disables the endpoint on a 410 or
// when it has failed for DisableAfter. The breaker's changes are logged.
func (s *Sink) settle(ctx context.Context, st *endpointState, out outcome, cause error) {
	st.mu.Lock()
	ep := st.ep
	wasProbe := st.probing
	wasOpen := !st.openUntil.IsZero()
	st.probing = false
	var clockRuns, changed bool
	switch out {
	case outcomeHeld:
		st.mu.Unlock()
		return
	case outcomeDelivered:
		if wasOpen {
			s.log.Info("webhook: breaker closed: the endpoint delivers again", "endpoint", ep.ID, "trips", st.trips)
			changed = st.changed(endpoints.BreakerClosed, time.Now())
		}
		st.failures, st.trips, st.openUntil = 0, 0, time.Time{}
		clockRuns = !st.ep.FailingSince.IsZero()
		st.ep.FailingSince = time.Time{}
	case outcomeRetry:
		st.failures++
		// Only a failed probe or the failure that reaches BreakerFailures
		// opens the breaker. A delivery that was already in flight when it
		// opened and fails too leaves it as it is: it says nothing new
		// about the endpoint, and must not stretch the cooldown.
		if wasProbe || (!wasOpen && st.failures >= s.cfg.BreakerFailures) {
			// Every failed probe doubles the cooldown: a dead endpoint
			// costs the batches one timeout per cooldown.
			cooldown := s.cfg.BreakerCooldown << min(st.trips, maxTrips)
			now := time.Now()
			st.openUntil = now.Add(cooldown)
			st.trips++
			changed = st.changed(endpoints.BreakerOpen, now)
			if wasProbe {
				s.log.Warn("webhook: breaker open again: the probe failed", "endpoint", ep.ID, "cooldown", cooldown, "err", cause)
			} else {
				s.log.Warn("webhook: breaker open: the endpoint's rows are held", "endpoint", ep.ID, "failures", st.failures, "cooldown", cooldown, "err", cause)
			}
		}
	}
	st.mu.Unlock()
	if changed {
		s.report(st)
	}

	switch {
	case out == outcomeDelivered:
		if clockRuns {
			if err := s.reg.MarkSucceeded(ctx, ep.ID); err != nil {
				s.log.Warn("webhook: clearing the failure clock failed", "endpoint", ep.ID, "err", err)
			}
		}
		return
	case out == outcomeGone:
		s.disable(ctx, st, "the endpoint answered 410 Gone")
		return
	}
	since := ep.FailingSince
	if since.IsZero() {
		var err error
		if since, err = s.reg.MarkFailing(ctx, ep.ID); err != nil {
			s.log.Warn("webhook: starting the failure clock failed", "endpoint", ep.ID, "err", err)
			return
		}
		st.mu.Lock()
		st.ep.FailingSince = since
		st.mu.Unlock()
	}
	if time.Since(since) >= s.cfg.DisableAfter {
		s.disable(ctx, st, fmt.Sprintf("deliveries failing since %s", since.UTC().Format(time.RFC3339)))
	}
}

// changed notes a change of the breaker to state at now, unless it is in
// state already, and reports whether the change needs [Sink.report]: no
// writer runs for the endpoint. st.mu is held.
func (st *endpointState) changed(state endpoints.BreakerState, now time.Time) bool {
	if st.reported == state {
		return false
	}
	st.reported, st.changedAt, st.unwritten = state, now, true
	if st.writing {
		return false // the running writer writes it next
	}
	st.writing = true
	return true
}

// breakerWriteTimeout bounds one write of a breaker change.
const breakerWriteTimeout = 10 * time.Second

// report writes the endpoint's breaker changes to the registry on a
// goroutine of their own, off the delivery's path, one at a time and in
// order; changes made while a write runs are written next, the latest
// only. A failed write is logged and not retried: the next change writes
// the state again.
func (s *Sink) report(st *endpointState) {
	go func() {
		for {
			st.mu.Lock()
			if !st.unwritten {
				st.writing = false
				st.mu.Unlock()
				return
			}
			id, state, since := st.ep.ID, st.reported, st.changedAt
			st.unwritten = false
			st.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), breakerWriteTimeout)
			err := s.reg.ReportBreaker(ctx, id, state, since, s.cfg.Instance)
			cancel()
			if err != nil {
				s.log.Warn("webhook: recording the breaker's state in the registry failed", "endpoint", id, "state", state, "err", err)
			}
		}
	}()
}

func (s *Sink) disable(ctx context.Context, st *endpointState, reason string) {
	st.mu.Lock()
	id := st.ep.ID
	already := !st.ep.Enabled()
	st.ep.DisabledAt, st.ep.DisabledReason = time.Now(), reason
	st.mu.Unlock()
	if already {
		return
	}
	if err := s.reg.Disable(ctx, id, reason); err != nil {
		s.log.Warn("webhook: disabling an endpoint failed", "endpoint", id, "err", err)
		return
	}
	s.log.Warn("webhook: endpoint disabled; its rows are held until it is enabled", "endpoint", id, "reason", reason)
	if h := s.cfg.Hooks.OnDisabled; h != nil {
		h(DisabledEvent{Endpoint: id, Reason: reason})
	}
}
