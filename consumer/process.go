package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/retry"
)

// Process applies msg effectively once and reports what became of it. In
// transactional mode the handler and the inbox record share one
// transaction; in leased mode the handler runs under a lease on the key.
// A failed attempt is retried in place with exponential backoff and full
// jitter (or handed back as Retry in Redeliver mode) until MaxAttempts or
// MaxElapsed, then the message becomes a dead letter.
//
// Process never panics on bad input and never leaves anything
// half-written: a nil message, a nil payload or an unusable key is
// DeadLettered with ErrInvalidMessage; a cancelled context or a database
// error is Retry, with nothing committed.
func (c *Consumer) Process(ctx context.Context, msg *Message) Result {
	start := time.Now()
	key, fingerprint, err := c.identify(msg)
	if err != nil {
		return c.finish(ctx, start, c.invalid(ctx, msg, key, err))
	}
	if err := c.store.RegisterScope(ctx, c.scope); err != nil {
		return c.finish(ctx, start, retryLater(key, err))
	}
	return c.finish(ctx, start, c.run(ctx, msg, key, fingerprint, 0, nil))
}

// identify derives the key and fingerprint of msg and validates them.
func (c *Consumer) identify(msg *Message) (key string, fingerprint []byte, err error) {
	if msg == nil {
		return "", nil, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if msg.Payload == nil {
		return msg.ID, nil, fmt.Errorf("%w: nil payload", ErrInvalidMessage)
	}
	// The user's funcs may panic on a malformed payload: that makes the
	// message invalid, not the consumer dead.
	err = guard("KeyFunc or Fingerprint", func() (err error) {
		if key, err = c.cfg.KeyFunc(msg); err == nil {
			fingerprint = c.cfg.Fingerprint(msg)
		}
		return err
	})
	if err == nil {
		err = c.store.Validate(key, fingerprint)
	}
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	return key, fingerprint, nil
}

// run attempts msg until it settles. attempt counts the attempts already
// made in this delivery; failure, if not nil, is the error of the last one.
func (c *Consumer) run(ctx context.Context, msg *Message, key string, fingerprint []byte, attempt int, failure error) Result {
	first := time.Now()
	if c.cfg.Redeliver && msg.Delivery > 1 {
		attempt += msg.Delivery - 1 // each earlier delivery was an attempt
	}
	for {
		var r Result
		if failure == nil {
			attempt++
			r, failure = c.try(ctx, msg, key, fingerprint)
			if failure == nil {
				r.Attempts = max(r.Attempts, attempt)
				return r
			}
		}
		if ctx.Err() != nil {
			return Result{Outcome: Retry, Key: key, Err: errors.Join(failure, ctx.Err()), Attempts: attempt}
		}
		attempts := max(attempt, r.Attempts)
		delay := c.delay(attempts, failure)
		if idemq.IsPermanent(failure) || attempts >= c.cfg.MaxAttempts || time.Since(first)+delay > c.cfg.MaxElapsed {
			return c.deadLetter(ctx, msg, key, fingerprint, attempts, failure)
		}
		if c.cfg.Redeliver {
			return Result{Outcome: Retry, Key: key, Err: failure, RetryAfter: delay, Attempts: attempts}
		}
		c.logger(key).LogAttrs(ctx, slog.LevelWarn, "retrying message", slog.Int("attempt", attempts),
			slog.Duration("delay", delay), slog.Any("error", failure))
		if c.cfg.Hooks.OnRetry != nil {
			c.cfg.Hooks.OnRetry(c.scope, key, attempts, failure, delay)
		}
		if err := retry.Sleep(ctx, delay); err != nil {
			return Result{Outcome: Retry, Key: key, Err: errors.Join(failure, err), Attempts: attempt}
		}
		failure = nil
	}
}

// try makes one attempt. It returns the handler's error, with r.Attempts
// set to the inbox's count in leased mode, or else a settled or Retry
// result.
func (c *Consumer) try(ctx context.Context, msg *Message, key string, fingerprint []byte) (r Result, handlerErr error) {
	if c.leased != nil {
		return c.tryLeased(ctx, msg, key, fingerprint)
	}
	tx, claim, err := c.store.BeginClaim(ctx, c.scope, key, fingerprint)
	if tx != nil {
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op; a failed rollback closes the connection
	}
	if conflict := (*inbox.ConflictError)(nil); errors.As(err, &conflict) {
		return c.conflict(ctx, tx, msg, key, conflict), nil
	}
	if err != nil {
		return retryLater(key, err), nil
	}
	if !claim.New {
		return existingResult(key, claim.Existing), nil
	}
	if err := guard("handler", func() error { return c.handler(ctx, handlerTx{tx}, msg) }); err != nil {
		return Result{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return retryLater(key, fmt.Errorf("consumer: commit: %w", err)), nil
	}
	return Result{Outcome: Applied, Key: key}, nil
}

func (c *Consumer) tryLeased(ctx context.Context, msg *Message, key string, fingerprint []byte) (Result, error) {
	claim, err := c.store.Acquire(ctx, c.scope, key, fingerprint, c.cfg.Owner, c.cfg.LeaseTTL)
	if conflict := (*inbox.ConflictError)(nil); errors.As(err, &conflict) {
		var r Result
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
			r = c.conflict(ctx, tx, msg, key, conflict)
			return nil
		})
		if err != nil {
			return retryLater(key, err), nil
		}
		return r, nil
	}
	if err != nil {
		return retryLater(key, err), nil
	}
	if !claim.New {
		return existingResult(key, claim.Existing), nil
	}
	lease := claim.Lease
	attempts := int(lease.Token)
	handlerErr := c.underLease(ctx, lease, func(ctx context.Context) error {
		return guard("handler", func() error { return c.leased(ctx, msg, lease) })
	})
	if handlerErr != nil {
		// Release the key to the next attempt; if this fails the lease
		// simply runs out.
		if err := c.store.Fail(ctx, lease, handlerErr, false); err != nil && !errors.Is(err, inbox.ErrLeaseLost) {
			c.logger(key).LogAttrs(ctx, slog.LevelWarn, "releasing lease", slog.Any("error", err))
		}
		return Result{Attempts: attempts}, handlerErr
	}
	if err := c.store.Complete(ctx, lease, nil); err != nil {
		// ErrLeaseLost: another worker took over; redelivery finds out
		// whether it succeeded.
		return Result{Outcome: Retry, Key: key, Err: err, Attempts: attempts}, nil
	}
	return Result{Outcome: Applied, Key: key, Attempts: attempts}, nil
}

// underLease runs fn while extending the lease every third of its
// duration; fn's context is cancelled if the lease is lost.
func (c *Consumer) underLease(ctx context.Context, lease inbox.Lease, fn func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		ticker := time.NewTicker(c.cfg.LeaseTTL / 3)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				if _, err := c.store.Extend(ctx, lease, c.cfg.LeaseTTL); errors.Is(err, inbox.ErrLeaseLost) {
					cancel(err)
					return
				}
			}
		}
	}()
	err := fn(ctx)
	close(done)
	<-stopped
	if cause := context.Cause(ctx); errors.Is(cause, inbox.ErrLeaseLost) {
		return errors.Join(err, cause)
	}
	return err
}

// conflict reports a fingerprint mismatch and hands it to the dead-letter
// hook inside tx.
func (c *Consumer) conflict(ctx context.Context, tx pgx.Tx, msg *Message, key string, conflict *inbox.ConflictError) Result {
	if c.cfg.DeadLetter != nil {
		err := c.cfg.DeadLetter(ctx, tx, msg, conflict)
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			return retryLater(key, fmt.Errorf("consumer: dead-letter hook for a conflict: %w", err))
		}
	}
	return Result{Outcome: Conflict, Key: key, Err: conflict}
}

// deadLetter records msg as FAILED_FINAL with its cause and calls the
// dead-letter hook, in one transaction.
func (c *Consumer) deadLetter(ctx context.Context, msg *Message, key string, fingerprint []byte, attempts int, cause error) Result {
	var found *inbox.Record
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		claim, err := c.store.DeadLetter(ctx, tx, c.scope, key, fingerprint, attempts, cause)
		if err != nil {
			return err
		}
		if !claim.New {
			found = claim.Existing
			return nil
		}
		if c.cfg.DeadLetter != nil {
			return c.cfg.DeadLetter(ctx, tx, msg, cause)
		}
		return nil
	})
	switch {
	case err != nil:
		return Result{Outcome: Retry, Key: key, Err: errors.Join(cause, fmt.Errorf("consumer: record dead letter: %w", err)), Attempts: attempts}
	case found != nil:
		return existingResult(key, found)
	}
	return Result{Outcome: DeadLettered, Key: key, Err: cause, Attempts: attempts}
}

// invalid dead-letters a message that has no usable key: there is nothing
// to record it under, so only the hook sees it.
func (c *Consumer) invalid(ctx context.Context, msg *Message, key string, cause error) Result {
	if c.cfg.DeadLetter != nil && msg != nil {
		err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error { return c.cfg.DeadLetter(ctx, tx, msg, cause) })
		if err != nil {
			return Result{Outcome: Retry, Key: key, Err: errors.Join(cause, err)}
		}
	}
	return Result{Outcome: DeadLettered, Key: key, Err: cause}
}

// existingResult maps a stored record found by a claim to an outcome.
func existingResult(key string, rec *inbox.Record) Result {
	switch rec.Status {
	case inbox.Succeeded:
		return Result{Outcome: Duplicate, Key: key}
	case inbox.FailedFinal:
		return Result{Outcome: DeadLettered, Key: key, Err: fmt.Errorf("%w: %s", ErrDeadLetter, rec.LastError), Attempts: rec.Attempts}
	}
	return Result{Outcome: Retry, Key: key, Err: ErrInProgress, RetryAfter: max(time.Until(rec.LeaseUntil), 0)}
}

func retryLater(key string, err error) Result {
	return Result{Outcome: Retry, Key: key, Err: err}
}

// delay is the backoff before the next attempt, at least any retry-after
// hint of err.
func (c *Consumer) delay(attempt int, err error) time.Duration {
	d := c.policy.Delay(attempt)
	if hint, ok := idemq.RetryAfterHint(err); ok && hint > d {
		d = hint
	}
	return d
}

// finish stamps the duration, logs the outcome and calls the hooks.
func (c *Consumer) finish(ctx context.Context, start time.Time, r Result) Result {
	r.Duration = time.Since(start)
	level := slog.LevelDebug
	switch r.Outcome {
	case Retry:
		level = slog.LevelWarn
	case Conflict, DeadLettered:
		level = slog.LevelError
	}
	if c.cfg.Logger.Enabled(ctx, level) {
		attrs := []slog.Attr{slog.Int("attempts", r.Attempts), slog.Duration("duration", r.Duration)}
		if r.Err != nil {
			attrs = append(attrs, slog.Any("error", r.Err))
		}
		c.logger(r.Key).LogAttrs(ctx, level, "message "+r.Outcome.String(), attrs...)
	}
	if c.cfg.Hooks.OnResult != nil {
		c.cfg.Hooks.OnResult(c.scope, r)
	}
	return r
}

func (c *Consumer) logger(key string) *slog.Logger {
	return c.cfg.Logger.With(slog.String("scope", c.scope), slog.String("key", key))
}

// guard runs the user's f, turning a panic into an error so that one bad
// message cannot take the consumer down.
func guard(what string, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("consumer: %s panicked: %v", what, p)
		}
	}()
	return f()
}
