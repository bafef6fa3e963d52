// Package retry holds the backoff policy shared by the consumer and the
// relay: exponential backoff with full jitter, built on cenkalti/backoff/v4.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy is exponential backoff with full jitter: the n-th retry waits a
// uniformly random duration in [0, min(Cap, Base·2^(n-1))].
type Policy struct {
	Base time.Duration
	Cap  time.Duration
}

// NewBackOff returns a backoff.BackOff following the policy, for retry loops.
//
// backoff/v4 draws interval·[1-f, 1+f]; with f = 1 and every interval halved
// that is exactly [0, min(Cap, Base·2^(n-1))], i.e. full jitter.
func (p Policy) NewBackOff(maxElapsed time.Duration) *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.Base/2),
		backoff.WithMaxInterval(p.Cap/2),
		backoff.WithRandomizationFactor(1),
		backoff.WithMultiplier(2),
		backoff.WithMaxElapsedTime(maxElapsed),
	)
	return b
}

// Delay returns the wait before retry number attempt (1-based), for callers
// that keep the attempt count elsewhere (the relay keeps it in the row).
func (p Policy) Delay(attempt int) time.Duration {
	ceiling := p.Base
	for i := 1; i < attempt && ceiling < p.Cap; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, p.Cap)
	b := Policy{Base: ceiling, Cap: ceiling}.NewBackOff(0)
	return b.NextBackOff()
}

// Sleep waits d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
