package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/internal/pgtx"
)

// Process applies msg effectively once and reports what became of it. In
// transactional mode the handler and the inbox record share one
// transaction; in leased mode the handler runs under a lease on the key.
// A failed attempt is counted in the inbox and retried in place with
// exponential backoff and full jitter (or handed back as Retry in
// Redeliver mode) until Retry.MaxAttempts failed attempts or
// Retry.MaxElapsed, then the message becomes a dead letter.
//
// Process never panics on bad input and never leaves anything
// half-written: a nil message, a nil payload or an unusable key is
// DeadLettered with ErrInvalidMessage; a cancelled context or a database
// error is Retry, with nothing committed and no attempt counted, and a
// database error sets Result.Unavailable.
func (c *Consumer) Process(ctx context.Context, msg *Message) Result {
	if c.tenants != nil {
		return c.tenants.process(ctx, c, msg)
	}
	start := time.Now()
	key, fingerprint, err := c.identify(msg)
	if err != nil {
		return c.finish(ctx, start, c.invalid(ctx, msg, key, err))
	}
	if err := c.claims.RegisterScope(ctx, c.scope); err != nil {
		return c.finish(ctx, start, unavailable(key, err))
	}
	return c.finish(ctx, start, c.run(ctx, msg, key, fingerprint, nil))
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
		err = c.claims.Validate(key, fingerprint)
	}
	if err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	return key, fingerprint, nil
}

// failure is a failed attempt, already counted in the inbox.
type failure struct {
	err error
	// failures is the inbox's count of failed attempts, this one included.
	failures int
}

// run attempts msg until it settles. failed, if not nil, is the failure of
// an attempt already made (by ProcessBatch).
func (c *Consumer) run(ctx context.Context, msg *Message, key string, fingerprint []byte, failed *failure) Result {
	first := time.Now()
	for {
		if failed == nil {
			var r Result
			if r, failed = c.try(ctx, msg, key, fingerprint); failed == nil {
				return r
			}
		}
		// A durable retry, so Retry.Delay rather than a backoff.BackOff: n
		// is the inbox's count of failed attempts, which survives
		// redeliveries and crashes, and the same n and delay decide between
		// waiting, handing the message back (Redeliver) and dead-lettering
		// it. A BackOff counts only the attempts of this loop.
		n := failed.failures
		hint, _ := idemq.RetryAfterHint(failed.err)
		delay := c.cfg.Retry.Delay(n, hint)
		if idemq.IsPermanent(failed.err) || n >= c.cfg.Retry.MaxAttempts || time.Since(first)+delay > c.cfg.Retry.MaxElapsed {
			return c.deadLetter(ctx, msg, key, fingerprint, n, failed.err)
		}
		if c.cfg.Redeliver {
			return Result{Outcome: Retry, Key: key, Err: failed.err, RetryAfter: delay, Attempts: n}
		}
		c.logger(key).LogAttrs(ctx, slog.LevelWarn, "retrying message", slog.Int("attempt", n),
			slog.Duration("delay", delay), slog.Any("error", failed.err))
		if c.cfg.Hooks.OnRetried != nil {
			c.cfg.Hooks.OnRetried(RetriedEvent{Scope: c.scope, Key: key, Attempt: n, Err: failed.err, Delay: delay})
		}
		if err := lifecycle.Sleep(ctx, delay); err != nil {
			return Result{Outcome: Retry, Key: key, Err: errors.Join(failed.err, err), Attempts: n}
		}
		failed = nil
	}
}

// try makes one attempt. It returns a settled or Retry result, or the
// handler's failure after counting it in the inbox.
func (c *Consumer) try(ctx context.Context, msg *Message, key string, fingerprint []byte) (Result, *failure) {
	if c.leased != nil {
		return c.tryLeased(ctx, msg, key, fingerprint)
	}
	tx, claim, err := c.claims.BeginClaim(ctx, c.scope, key, fingerprint)
	if tx != nil {
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op; a failed rollback closes the connection
	}
	if conflict := (*inbox.ConflictError)(nil); errors.As(err, &conflict) {
		return c.conflict(ctx, tx, msg, key, conflict), nil
	}
	if err != nil {
		return unavailable(key, err), nil
	}
	if !claim.New {
		return existingResult(key, claim.Existing), nil
	}
	handlerErr := c.overDelivered(msg)
	if handlerErr == nil {
		htx := pgtx.Handler(tx)
		if handlerErr = guard("handler", func() error { return c.handler(ctx, htx, msg) }); handlerErr == nil {
			// A handler that swallowed a statement's error: its commit
			// would roll back, and it must count as the failure it is.
			handlerErr = htx.Aborted()
		}
	}
	if handlerErr != nil {
		// The rollback comes first: the failure is counted in a
		// transaction of its own, so it survives the rollback.
		// Whether the connection was lost is read before the rollback,
		// which hands it back to the pool, to another goroutine; a failed
		// rollback closes it.
		lost := connLost(tx)
		rollbackErr := tx.Rollback(ctx)
		if err := notAFailure(ctx, lost || rollbackErr != nil, errors.Join(handlerErr, rollbackErr)); err != nil {
			return unavailable(key, err), nil
		}
		return c.recordFailure(ctx, key, fingerprint, handlerErr)
	}
	if err := tx.Commit(ctx); err != nil {
		return unavailable(key, fmt.Errorf("consumer: commit: %w", err)), nil
	}
	return Result{Outcome: Applied, Key: key, Attempts: claim.Failures + 1}, nil
}

// overDelivered returns a permanent error for a Redeliver-mode message
// that the transport delivered far more often than attempts allow: the far
// backstop for a message that kills its consumer every time.
func (c *Consumer) overDelivered(msg *Message) error {
	if !c.cfg.Redeliver || msg.Delivery <= RedeliverBackstop*c.cfg.Retry.MaxAttempts {
		return nil
	}
	return idemq.Permanent(fmt.Errorf("%w: %d deliveries", ErrTooManyDeliveries, msg.Delivery))
}

// notAFailure returns an error when a failed attempt says nothing about the
// message: the context was cancelled, the connection was lost (which also
// fails the handler's statements), or the database refused the
// transaction for a reason of its own (see transient). Such an attempt is
// not counted. lost tells whether the transaction's connection was lost.
func notAFailure(ctx context.Context, lost bool, err error) error {
	switch {
	case ctx.Err() != nil:
		return errors.Join(err, ctx.Err())
	case lost:
		return fmt.Errorf("consumer: connection lost: %w", err)
	case transient(err):
		return fmt.Errorf("consumer: database error: %w", err)
	}
	return nil
}

// connLost reports whether tx's connection is closed; call it only while
// tx is live, before its commit or rollback releases the connection.
func connLost(tx pgx.Tx) bool {
	conn := tx.Conn()
	return conn == nil || conn.IsClosed()
}

// transient reports a database error that says nothing about the message,
// unless the handler marked it permanent: a serialization failure or a
// deadlock (class 40), a lost connection (class 08), a server shutting
// down or cancelling statements (class 57), or a server out of resources
// (class 53). The same message succeeds when tried again.
//
// pgerrcode57Timeout (query_canceled, also raised by statement_timeout) is
// the exception in class 57: a handler whose statement always times out
// fails for real.
const pgerrcode57Timeout = "57014"

func transient(err error) bool {
	var pg *pgconn.PgError
	if idemq.IsPermanent(err) || !errors.As(err, &pg) || len(pg.Code) < 2 {
		return false
	}
	switch pg.Code[:2] {
	case "40", "08", "53":
		return true
	case "57":
		return pg.Code != pgerrcode57Timeout // a statement timeout is the handler's own
	}
	return false
}

// recordFailure counts a failed attempt in the inbox, after its
// transaction rolled back. If that fails the attempt is not counted and
// the message is Retry: a database error is never held against it.
func (c *Consumer) recordFailure(ctx context.Context, key string, fingerprint []byte, handlerErr error) (Result, *failure) {
	rec, err := c.claims.RecordFailure(ctx, c.scope, key, fingerprint, handlerErr)
	if err != nil {
		return unavailable(key, errors.Join(handlerErr, fmt.Errorf("consumer: count failed attempt: %w", err))), nil
	}
	if rec.Status != inbox.FailedRetryable {
		return existingResult(key, &rec), nil // another attempt settled it meanwhile
	}
	return Result{}, &failure{err: handlerErr, failures: rec.Failures}
}

func (c *Consumer) tryLeased(ctx context.Context, msg *Message, key string, fingerprint []byte) (Result, *failure) {
	claim, err := c.store.Acquire(ctx, c.scope, key, fingerprint, c.cfg.Owner, c.cfg.LeaseTTL)
	if conflict := (*inbox.ConflictError)(nil); errors.As(err, &conflict) {
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			return unavailable(key, err), nil
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op
		return c.conflict(ctx, tx, msg, key, conflict), nil
	}
	if err != nil {
		return unavailable(key, err), nil
	}
	if !claim.New {
		return existingResult(key, (*inboxsql.Record)(claim.Existing)), nil
	}
	lease := claim.Lease
	handlerErr := c.overDelivered(msg)
	if handlerErr == nil {
		handlerErr = c.underLease(ctx, lease, func(ctx context.Context) error {
			return guard("handler", func() error { return c.leased(ctx, msg, lease) })
		})
	}
	// The outcome is recorded even if ctx ended meanwhile, within the
	// lease's own duration.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.LeaseTTL)
	defer cancel()
	if handlerErr != nil {
		if errors.Is(handlerErr, idemq.ErrLeaseLost) {
			return Result{Outcome: Retry, Key: key, Err: handlerErr}, nil // another worker holds the key now
		}
		if ctx.Err() != nil {
			// Not a failure of the message: the key goes back to the next
			// attempt at once, without counting this one.
			if err := c.store.Abandon(fctx, lease); err != nil {
				handlerErr = errors.Join(handlerErr, fmt.Errorf("consumer: give the lease back: %w", err))
			}
			return unavailable(key, errors.Join(handlerErr, ctx.Err())), nil
		}
		// Count the failure and release the key to the next attempt.
		if err := c.store.Fail(fctx, lease, handlerErr); err != nil {
			return unavailable(key, errors.Join(handlerErr, fmt.Errorf("consumer: count failed attempt: %w", err))), nil
		}
		return Result{}, &failure{err: handlerErr, failures: claim.Failures + 1}
	}
	if err := c.store.Complete(fctx, lease, nil); err != nil {
		// ErrLeaseLost: another worker took over; redelivery finds out
		// whether it succeeded. Any other error is the database's.
		return Result{Outcome: Retry, Key: key, Err: err, Attempts: claim.Failures + 1, Unavailable: !errors.Is(err, idemq.ErrLeaseLost)}, nil
	}
	return Result{Outcome: Applied, Key: key, Attempts: claim.Failures + 1}, nil
}

// underLease runs fn while extending the lease every third of its
// duration; fn's context is cancelled if the lease is lost.
func (c *Consumer) underLease(ctx context.Context, lease idemq.Lease, fn func(context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := lifecycle.KeepAlive(ctx, c.cfg.LeaseTTL/3, func(rctx context.Context) error {
		_, err := c.store.Extend(rctx, lease, c.cfg.LeaseTTL)
		if errors.Is(err, idemq.ErrLeaseLost) {
			cancel(err)
		}
		return err
	})
	err := fn(ctx)
	if lost := stop(); lost != nil {
		return errors.Join(err, lost)
	}
	return err
}

// conflict records a fingerprint mismatch in the inbox, hands it to the
// dead-letter hook and commits tx.
func (c *Consumer) conflict(ctx context.Context, tx pgx.Tx, msg *Message, key string, conflict *inbox.ConflictError) Result {
	err := c.recordConflict(ctx, tx, msg, conflict)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return unavailable(key, err)
	}
	return Result{Outcome: Conflict, Key: key, Err: conflict}
}

// recordConflict records a conflict in tx, so it can be listed, released
// and purged (inbox.Store.Conflicts), and calls the dead-letter hook.
func (c *Consumer) recordConflict(ctx context.Context, tx pgx.Tx, msg *Message, conflict *inbox.ConflictError) error {
	if err := c.claims.RecordConflictTx(ctx, tx, c.scope, conflict.Key, conflict.Fingerprint); err != nil {
		return err
	}
	if c.cfg.DeadLetter != nil {
		if err := c.cfg.DeadLetter(ctx, tx, msg, conflict); err != nil {
			return fmt.Errorf("consumer: dead-letter hook for a conflict: %w", err)
		}
	}
	return nil
}

// deadLetter records msg as FAILED_FINAL with its cause and the number of
// failed attempts, and calls the dead-letter hook, in one transaction.
func (c *Consumer) deadLetter(ctx context.Context, msg *Message, key string, fingerprint []byte, attempts int, cause error) Result {
	var found *inboxsql.Record
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		claim, err := c.claims.DeadLetterTx(ctx, tx, c.scope, key, fingerprint, attempts, cause)
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
		return Result{Outcome: Retry, Key: key, Err: errors.Join(cause, fmt.Errorf("consumer: record dead letter: %w", err)), Attempts: attempts, Unavailable: true}
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
			return unavailable(key, errors.Join(cause, err))
		}
	}
	return Result{Outcome: DeadLettered, Key: key, Err: cause}
}

// existingResult maps a stored record found by a claim to an outcome.
func existingResult(key string, rec *inboxsql.Record) Result {
	switch rec.Status {
	case inbox.Succeeded:
		return Result{Outcome: Duplicate, Key: key}
	case inbox.FailedFinal:
		return Result{Outcome: DeadLettered, Key: key, Err: fmt.Errorf("%w: %s", ErrDeadLetter, rec.LastError), Attempts: rec.Attempts}
	}
	return Result{Outcome: Retry, Key: key, Err: ErrInProgress, RetryAfter: max(time.Until(rec.LeaseUntil), 0)}
}

// unavailable is the Retry of a message the database failed: nothing was
// applied or counted, and the message is not to blame (see
// Result.Unavailable; finish clears the flag when ctx ended instead).
func unavailable(key string, err error) Result {
	return Result{Outcome: Retry, Key: key, Err: err, Unavailable: true}
}

// finish stamps the duration, logs the outcome and calls the hooks.
func (c *Consumer) finish(ctx context.Context, start time.Time, r Result) Result {
	r.Duration = time.Since(start)
	r.Unavailable = r.Unavailable && ctx.Err() == nil // a shutdown, not an outage
	level := slog.LevelDebug
	switch {
	case r.Outcome == Retry && !r.Unavailable:
		// An outage is one line of the transport's, not one per message.
		level = slog.LevelWarn
	case r.Outcome == Conflict || r.Outcome == DeadLettered:
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
		c.cfg.Hooks.OnResult(ResultEvent{Scope: c.scope, Result: r})
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
