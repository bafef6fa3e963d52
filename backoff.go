package idemq

import (
	"time"

	"github.com/cenkalti/backoff/v4"
)

// BackOff returns r as a [backoff.BackOff] of github.com/cenkalti/backoff/v4,
// for in-place retry loops (backoff.RetryNotify with backoff.WithContext):
// the n-th NextBackOff returns [Retry.Delay](n, hint), the same full
// jitter, and backoff.Stop once n failed attempts reach MaxAttempts or
// the delay would end past MaxElapsed since the BackOff was made or
// Reset. A zero MaxAttempts or MaxElapsed sets no bound.
//
// Durable retries, whose count or next attempt time is stored (the
// relay's rows, the inbox's failure count), use [Retry.Delay] directly.
func (r Retry) BackOff() *RetryBackOff {
	return &RetryBackOff{r: r, start: time.Now()}
}

// RetryBackOff is the [backoff.BackOff] of a [Retry]. It is not safe for
// concurrent use: make one per retry loop.
type RetryBackOff struct {
	r       Retry
	retries int
	hint    time.Duration
	start   time.Time
}

var _ backoff.BackOff = (*RetryBackOff)(nil)

// NextBackOff implements [backoff.BackOff]: the wait before the next
// attempt, or backoff.Stop.
func (b *RetryBackOff) NextBackOff() time.Duration {
	b.retries++
	hint := b.hint
	b.hint = 0
	if b.r.MaxAttempts > 0 && b.retries >= b.r.MaxAttempts {
		return backoff.Stop
	}
	d := b.r.Delay(b.retries, hint)
	if b.r.MaxElapsed > 0 && time.Since(b.start)+d > b.r.MaxElapsed {
		return backoff.Stop
	}
	return d
}

// Reset implements [backoff.BackOff]: the next attempt is the first again,
// and MaxElapsed counts from now.
func (b *RetryBackOff) Reset() {
	b.retries, b.hint, b.start = 0, 0, time.Now()
}

// Hint makes the next NextBackOff wait at least d: a delay the failing
// party asked for (a Retry-After, a gRPC pushback; see [RetryAfterHint]).
// backoff v4 has no notion of a hint, so the operation hands it over
// before it returns its error.
func (b *RetryBackOff) Hint(d time.Duration) { b.hint = d }
