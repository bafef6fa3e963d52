package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Acquire claims key for owner for the duration ttl, for side effects
// outside Postgres. It takes the key when it is new, when the last attempt
// failed retryably, or when the holder's lease ran out (a takeover); each
// claim hands out a larger fencing token in Claim.Lease.
//
// Otherwise Claim.Existing is the stored record: Succeeded (a duplicate,
// with its stored result), InProgress under a live lease (someone else is
// working on it until Existing.LeaseUntil), or FailedFinal (a dead letter).
// A different fingerprint is a *ConflictError.
func (s *Store) Acquire(ctx context.Context, scope, key string, fingerprint []byte, owner string, ttl time.Duration) (Claim, error) {
	if ttl <= 0 {
		return Claim{}, fmt.Errorf("inbox: lease duration must be positive, got %v", ttl)
	}
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return Claim{}, err
	}
	for range 2 {
		lease := Lease{Scope: scope, Key: key, Owner: owner}
		err := s.db.QueryRow(ctx, s.sql.acquire, k.scopeID, k.id, k.fingerprint, k.text, s.cfg.Retention, owner, ttl).
			Scan(&lease.Token, &lease.Until)
		if err == nil {
			return Claim{New: true, Lease: lease}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Claim{}, fmt.Errorf("inbox: acquire %q: %w", key, err)
		}
		c, found, err := s.stored(ctx, s.db, k)
		if found || err != nil {
			return c, err
		}
		// Deleted by GC in between: claim it afresh.
	}
	return Claim{}, fmt.Errorf("inbox: acquire %q: record vanished twice", key)
}

// Complete finalizes a lease as SUCCEEDED with an optional result to replay
// to later duplicates. It fails with ErrLeaseLost when the lease was taken
// over or already finalized; the successor's outcome then stands.
func (s *Store) Complete(ctx context.Context, lease Lease, result []byte) error {
	return s.CompleteTx(ctx, s.db, lease, result)
}

// CompleteTx is [Store.Complete] inside the caller's transaction, so that
// the finalize commits with the caller's own writes.
func (s *Store) CompleteTx(ctx context.Context, tx DB, lease Lease, result []byte) error {
	return s.finalize(ctx, tx, lease, s.sql.complete, result, s.cfg.Retention)
}

// Fail finalizes a lease after a failed attempt: FAILED_RETRYABLE releases
// the key to the next Acquire at once, FAILED_FINAL (final) makes it a dead
// letter. cause is kept as the record's last error. It fails with
// ErrLeaseLost like [Store.Complete].
func (s *Store) Fail(ctx context.Context, lease Lease, cause error, final bool) error {
	status, text := FailedRetryable, "failed"
	if final {
		status = FailedFinal
	}
	if cause != nil {
		text = cause.Error()
	}
	return s.finalize(ctx, s.db, lease, s.sql.fail, status, text, s.cfg.Retention)
}

// Extend moves the lease's deadline to ttl from now, for work that runs
// longer than planned, and returns the extended lease. It fails with
// ErrLeaseLost when the lease was taken over or finalized.
func (s *Store) Extend(ctx context.Context, lease Lease, ttl time.Duration) (Lease, error) {
	scopeID, err := s.scopeID(ctx, lease.Scope)
	if err != nil {
		return lease, err
	}
	id, _ := keyID(lease.Key)
	err = s.db.QueryRow(ctx, s.sql.extend, scopeID, id, lease.Token, ttl).Scan(&lease.Until)
	if errors.Is(err, pgx.ErrNoRows) {
		return lease, ErrLeaseLost
	}
	if err != nil {
		return lease, fmt.Errorf("inbox: extend lease %q: %w", lease.Key, err)
	}
	return lease, nil
}

func (s *Store) finalize(ctx context.Context, db DB, lease Lease, sql string, args ...any) error {
	scopeID, err := s.scopeID(ctx, lease.Scope)
	if err != nil {
		return err
	}
	id, _ := keyID(lease.Key)
	var tag pgconn.CommandTag
	tag, err = db.Exec(ctx, sql, append([]any{scopeID, id, lease.Token}, args...)...)
	if err != nil {
		return fmt.Errorf("inbox: finalize lease %q: %w", lease.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrLeaseLost
	}
	return nil
}
