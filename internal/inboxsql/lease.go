package inboxsql

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
)

// AcquireResult is the outcome of [Store.Acquire].
type AcquireResult struct {
	// New reports that the caller now holds Lease on the key and must do
	// the work. Otherwise Existing holds the stored record.
	New      bool
	Existing *Record
	// Failures counts the failed attempts before this claim (New only).
	Failures int
	// Lease is the caller's hold on the key when New.
	Lease idemq.Lease
}

// Acquire claims key for owner for the duration ttl, for side effects
// outside Postgres. It takes the key when it is new, when the last attempt
// failed retryably, or when the holder's lease ran out (a takeover); each
// claim hands out a larger fencing token in the result's Lease, and
// Failures says how many earlier attempts failed (a takeover of an expired
// lease is not a failure).
//
// Otherwise Existing is the stored record: Succeeded (a duplicate,
// with its stored result), InProgress under a live lease (someone else is
// working on it until Existing.LeaseUntil), or FailedFinal (a dead letter).
// A different fingerprint is a *ConflictError.
func (s *Store) Acquire(ctx context.Context, scope, key string, fingerprint []byte, owner string, ttl time.Duration) (AcquireResult, error) {
	if err := checkTTL(ttl); err != nil {
		return AcquireResult{}, err
	}
	k, err := s.Resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return AcquireResult{}, err
	}
	for range 2 {
		lease := idemq.Lease{Scope: scope, Key: key}
		var failures int32
		err := s.db.QueryRow(ctx, s.sql.acquire, append(k.Args(s.cfg.Retention), owner, ttl)...).
			Scan(&lease.Token, &lease.Until, &failures)
		if err == nil {
			return AcquireResult{New: true, Failures: int(failures), Lease: lease}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return AcquireResult{}, fmt.Errorf("inbox: acquire %q: %w", key, noPartition(err))
		}
		rec, found, err := s.storedRecord(ctx, s.db, k)
		if err != nil {
			return AcquireResult{}, err
		}
		if found {
			rec, err := s.against(rec, key, k.Fingerprint)
			return AcquireResult{Existing: &rec}, err
		}
		// Deleted by GC in between: claim it afresh.
	}
	return AcquireResult{}, fmt.Errorf("inbox: acquire %q: record vanished twice", key)
}

// MinLeaseTTL is the shortest lease Acquire and Extend take: a shorter
// one runs out before its holder can use it, and under Postgres's 1 µs
// interval unit it would be stored as none at all.
const MinLeaseTTL = time.Millisecond

func checkTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL {
		return fmt.Errorf("inbox: lease duration %v is below the minimum of %v", ttl, MinLeaseTTL)
	}
	return nil
}

// Complete finalizes a lease as SUCCEEDED with an optional result to replay
// to later duplicates. It fails with idemq.ErrLeaseLost when the lease was taken
// over or already finalized; the successor's outcome then stands.
func (s *Store) Complete(ctx context.Context, lease idemq.Lease, result []byte) error {
	return s.finalize(ctx, s.db, lease, s.sql.complete, result, s.cfg.Retention)
}

// CompleteTx is [Store.Complete] inside the caller's transaction, so that
// the finalize commits with the caller's own writes; if tx rolls back, the
// lease stays as it was and runs out.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, result []byte) error {
	if pgtx.IsNil(tx) {
		return ErrNilTx
	}
	return s.finalize(ctx, tx, lease, s.sql.complete, result, s.cfg.Retention)
}

// Fail finalizes a lease after a failed attempt as FAILED_RETRYABLE: the
// key goes to the next Acquire at once, with one more failure counted and
// cause kept as the record's last error. It fails with idemq.ErrLeaseLost like
// [Store.Complete].
func (s *Store) Fail(ctx context.Context, lease idemq.Lease, cause error) error {
	return s.finalize(ctx, s.db, lease, s.sql.fail, FailedRetryable, errText(cause), s.cfg.Retention)
}

// FailTx is [Store.Fail] inside the caller's transaction; if tx rolls
// back, the lease stays as it was and runs out.
func (s *Store) FailTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, cause error) error {
	if pgtx.IsNil(tx) {
		return ErrNilTx
	}
	return s.finalize(ctx, tx, lease, s.sql.fail, FailedRetryable, errText(cause), s.cfg.Retention)
}

// FailFinal finalizes a lease after a failed attempt as FAILED_FINAL: the
// message is a dead letter, kept with cause. It fails with idemq.ErrLeaseLost
// like [Store.Complete].
func (s *Store) FailFinal(ctx context.Context, lease idemq.Lease, cause error) error {
	return s.finalize(ctx, s.db, lease, s.sql.fail, FailedFinal, errText(cause), s.cfg.Retention)
}

// FailFinalTx is [Store.FailFinal] inside the caller's transaction; if tx
// rolls back, the lease stays as it was and runs out.
func (s *Store) FailFinalTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, cause error) error {
	if pgtx.IsNil(tx) {
		return ErrNilTx
	}
	return s.finalize(ctx, tx, lease, s.sql.fail, FailedFinal, errText(cause), s.cfg.Retention)
}

// Abandon gives the key back before its lease runs out, for a holder that
// stops without an outcome (its context was cancelled, it shuts down): no
// failure is counted and the next Acquire takes over at once instead of
// waiting for the deadline. It fails with idemq.ErrLeaseLost like
// [Store.Complete].
func (s *Store) Abandon(ctx context.Context, lease idemq.Lease) error {
	return s.finalize(ctx, s.db, lease, s.sql.abandon)
}

// Extend moves the lease's deadline to ttl from now, for work that runs
// longer than planned, and returns the extended lease. It fails with
// idemq.ErrLeaseLost when the lease was taken over or finalized.
func (s *Store) Extend(ctx context.Context, lease idemq.Lease, ttl time.Duration) (idemq.Lease, error) {
	if err := checkTTL(ttl); err != nil {
		return lease, err
	}
	scopeID, err := s.lookupScope(ctx, lease.Scope)
	if err != nil {
		return lease, err
	}
	id, _ := KeyID(lease.Key)
	err = s.db.QueryRow(ctx, s.sql.extend, scopeID, id, lease.Token, ttl).Scan(&lease.Until)
	if errors.Is(err, pgx.ErrNoRows) {
		return lease, idemq.ErrLeaseLost
	}
	if err != nil {
		return lease, fmt.Errorf("inbox: extend lease %q: %w", lease.Key, err)
	}
	return lease, nil
}

func (s *Store) finalize(ctx context.Context, db DB, lease idemq.Lease, sql string, args ...any) error {
	scopeID, err := s.lookupScope(ctx, lease.Scope)
	if err != nil {
		return err
	}
	id, _ := KeyID(lease.Key)
	var tag pgconn.CommandTag
	tag, err = db.Exec(ctx, sql, append([]any{scopeID, id, lease.Token}, args...)...)
	if err != nil {
		return fmt.Errorf("inbox: finalize lease %q: %w", lease.Key, err)
	}
	if tag.RowsAffected() == 0 {
		return idemq.ErrLeaseLost
	}
	return nil
}

// Get returns the record of (scope, key), or ErrNotFound.
func (s *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	k, err := s.Resolve(ctx, scope, key, nil)
	if err != nil {
		return Record{}, err
	}
	rec, found, err := s.storedRecord(ctx, s.db, k)
	if err == nil && !found {
		err = ErrNotFound
	}
	return rec, err
}

// Lookup returns the records of key in every scope, most recently
// updated first, each with its ErrorClass. It probes the primary key once
// per scope. None is an empty slice, not an error.
func (s *Store) Lookup(ctx context.Context, key string) ([]Record, error) {
	if key == "" {
		return nil, fmt.Errorf("inbox: lookup: empty key")
	}
	id, _ := KeyID(key)
	rows, err := s.db.Query(ctx, s.sql.lookup, id)
	if err != nil {
		return nil, fmt.Errorf("inbox: lookup %q: %w", key, NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var scope, class string
		var rec Scan
		if err := row.Scan(append([]any{&scope, &class}, rec.Dest()...)...); err != nil {
			return Record{}, err
		}
		r := rec.Record(scope, key)
		r.ErrorClass = class
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: lookup %q: %w", key, NotMigrated(err))
	}
	return out, nil
}

// GC deletes records and recorded conflicts whose retention ran out,
// batchSize at a time (each batch its own short statement, through an
// expires_at index), until none is left, and returns how many it deleted;
// records under a live lease are kept. On a partitioned table it drops
// expired partitions and creates those due instead of deleting records.
// batchSize <= 0 means 1000.
func (s *Store) GC(ctx context.Context, batchSize int) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	if err := s.gcPartitions(ctx); err != nil {
		return 0, err
	}
	var total int64
	for _, sql := range []string{s.sql.gc, s.sql.gcConflicts} {
		for {
			tag, err := s.db.Exec(ctx, sql, batchSize)
			if err != nil {
				return total, fmt.Errorf("inbox: gc: %w", NotMigrated(err))
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

// Table returns the Store's validated table name.
func (s *Store) Table() pgutil.Table { return s.table }

// GCChore is the maintenance chore that runs GC on the Store's table,
// named what (the table's role: "inbox", "requests") and the table. It
// runs every minute and, on a partitioned table, at least four times per
// PartitionInterval, so the partitions made ahead never run out.
func (s *Store) GCChore(what string) idemq.Chore {
	every := time.Minute
	if s.cfg.Partitioning != Unpartitioned {
		every = min(every, s.cfg.PartitionInterval/4)
	}
	return pgutil.Chore(s.db, what+" gc "+s.table.String(), every, func(ctx context.Context) (int64, error) {
		return s.GC(ctx, 0)
	})
}
