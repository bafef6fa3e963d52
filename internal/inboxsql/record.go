package inboxsql

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/pgutil"
)

// Status is where a record stands in the state machine
// IN_PROGRESS -> SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL. Its String
// method gives those names.
type Status int16

// The statuses, as stored.
const (
	// InProgress: a leased worker owns the key until its lease runs out.
	InProgress Status = 1
	// Succeeded: the message was applied; redeliveries are duplicates.
	Succeeded Status = 2
	// FailedRetryable: an attempt failed; the next claim or Acquire takes
	// over.
	FailedRetryable Status = 3
	// FailedFinal: the message is a dead letter, kept with its last error.
	FailedFinal Status = 4
)

func (s Status) String() string {
	switch s {
	case InProgress:
		return "IN_PROGRESS"
	case Succeeded:
		return "SUCCEEDED"
	case FailedRetryable:
		return "FAILED_RETRYABLE"
	case FailedFinal:
		return "FAILED_FINAL"
	}
	return fmt.Sprintf("Status(%d)", int16(s))
}

// Record is the stored state of one (scope, key).
type Record struct {
	Scope       string
	Key         string
	Fingerprint []byte
	Status      Status
	// Owner and LeaseUntil are set while a leased worker holds the key.
	Owner      string
	LeaseUntil time.Time
	// Attempts counts the claims of the key: every claim, takeover and
	// failed attempt adds one.
	Attempts int
	// Token is the fencing token of the latest leased claim
	// ([idemq.Lease]), 0 when the key was never leased.
	Token int64
	// Failures counts the attempts whose handler failed. Crashes, lost
	// connections and cancelled contexts are not failures and never count.
	Failures  int
	Result    []byte
	LastError string
	// ErrorClass is the class of LastError (see inbox.DeadGroup) of a
	// dead letter listed by inbox.Store.DeadLetters or found by Lookup;
	// empty in other results.
	ErrorClass string
	// Superseded lists the fingerprints the key was applied with before a
	// released conflict handed it to Fingerprint (see inbox.Store.Release
	// with DeadFilter.Conflicts): their redeliveries are duplicates.
	Superseded [][]byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time
}

// recordColumns are the stored columns a Record is read from, in the order of
// [Scan.Dest], for the table aliased r.
const recordColumns = `r.created_at, r.updated_at, r.expires_at, r.attempts, r.failures, r.status,
	r.fingerprint, r.owner, r.lease_until, r.result, r.last_error, r.superseded, r.token`

// Scan scans the [recordColumns] of a record; its nullable columns go through
// pointers.
type Scan struct {
	rec              Record
	attempts         int32
	failures         int32
	token            *int64
	owner, lastError *string
	leaseUntil       *time.Time
}

// Dest lists scan targets in the order of recordColumns.
func (r *Scan) Dest() []any {
	return []any{&r.rec.CreatedAt, &r.rec.UpdatedAt, &r.rec.ExpiresAt, &r.attempts, &r.failures, &r.rec.Status,
		&r.rec.Fingerprint, &r.owner, &r.leaseUntil, &r.rec.Result, &r.lastError, &r.rec.Superseded, &r.token}
}

// Record returns the scanned record of (scope, key).
func (r *Scan) Record(scope, key string) Record {
	rec := r.rec
	rec.Scope, rec.Key, rec.Attempts, rec.Failures = scope, key, int(r.attempts), int(r.failures)
	rec.Owner, rec.LeaseUntil, rec.LastError = deref(r.owner), deref(r.leaseUntil), deref(r.lastError)
	rec.Token = deref(r.token)
	return rec
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// ConflictError reports a key seen before with a different payload
// fingerprint. The message is not applied: a reused key with another
// payload is a producer bug that must surface, never be skipped.
type ConflictError struct {
	Key         string
	Fingerprint []byte
	// Stored is the record the key already has: when it was first seen,
	// its status and its fingerprint.
	Stored Record
}

// Is makes every ConflictError match idemq.ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == idemq.ErrConflict }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("inbox: key %q was first seen at %s (%s) with fingerprint %x, now it comes with %x",
		e.Key, e.Stored.CreatedAt.Format(time.RFC3339Nano), e.Stored.Status, e.Stored.Fingerprint, e.Fingerprint)
}

var (
	// ErrInvalidKey reports an empty key, a key over the limit, one that
	// is not valid UTF-8 or contains NUL, or one the table's layout cannot
	// place (PartitionByKey takes UUIDv7 keys only).
	ErrInvalidKey = errors.New("inbox: invalid key")
	// ErrNotFound reports that no record exists for the key: it is
	// idemq.ErrNotFound.
	ErrNotFound = idemq.ErrNotFound
	// ErrNotMigrated is matched by the error of a call on a database whose
	// inbox tables are missing or older than this version expects.
	ErrNotMigrated = errors.New("inbox: the inbox tables are missing or out of date: run `idemq migrate` or Store.Migrate (consumer.Consumer.Migrate) first")
	// ErrNilTx reports a nil transaction passed to a Tx method.
	ErrNilTx error = idemq.NewConfigError("inbox", "tx", "is nil: pass the caller's transaction, or use the call without Tx")
)

// NotMigrated marks err with ErrNotMigrated when Postgres reports an
// undefined table, column or schema.
func NotMigrated(err error) error {
	if pgutil.Undefined(err) {
		return fmt.Errorf("%w: %w", ErrNotMigrated, err)
	}
	return err
}

// errText is the stored text of a failure's cause.
func errText(cause error) string { return errtext.Of(cause) }
