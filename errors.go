package idemq

import (
	"errors"
	"fmt"
	"time"
)

// Permanent marks err as not worth retrying: a consumer dead-letters the
// message at once, a relay moves the outbox row to its dead letters.
// Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err, or any error it wraps, was marked with
// [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// RetryAfter marks err as retryable no sooner than d from now, for a
// downstream that said when it will be ready (HTTP 429/503 Retry-After, a
// rate limit). The retry waits the longer of d and the backoff delay.
// RetryAfter(nil, d) is nil.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

// RetryAfterHint returns the delay attached by [RetryAfter], if any.
func RetryAfterHint(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("retry after %v: %v", e.after, e.err)
}
func (e *retryAfterError) Unwrap() error { return e.err }
