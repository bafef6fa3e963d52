package inbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/inboxsql"
)

// Status is where a record stands in the state machine
// IN_PROGRESS -> SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL. Its String
// method gives those names.
type Status = inboxsql.Status

const (
	// InProgress: a leased worker owns the key until its lease runs out.
	InProgress = inboxsql.InProgress
	// Succeeded: the message was applied; redeliveries are duplicates.
	Succeeded = inboxsql.Succeeded
	// FailedRetryable: an attempt failed; the next claim or Acquire takes
	// over.
	FailedRetryable = inboxsql.FailedRetryable
	// FailedFinal: the message is a dead letter, kept with its last error.
	FailedFinal = inboxsql.FailedFinal
)

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
	// Token is the fencing token of the latest leased claim ([idemq.Lease]), 0
	// when the key was never leased.
	Token int64
	// Failures counts the attempts whose handler failed. Crashes, lost
	// connections and cancelled contexts are not failures and never count.
	Failures  int
	Result    []byte
	LastError string
	// Superseded lists the fingerprints the key was applied with before a
	// released conflict handed it to Fingerprint (see
	// [Store.ReleaseConflicts]): their redeliveries are duplicates.
	Superseded [][]byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time
}

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

var (
	// ErrInvalidKey reports an empty key, a key over the limit, or one that
	// is not valid UTF-8 or contains NUL.
	ErrInvalidKey = inboxsql.ErrInvalidKey
	// ErrNotFound reports that no record exists for the key.
	ErrNotFound = errors.New("inbox: record not found")
)

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

func (e *ConflictError) Error() string {
	return fmt.Sprintf("inbox: key %q was first seen at %s (%s) with fingerprint %x, now it comes with %x",
		e.Key, e.Stored.CreatedAt.Format(time.RFC3339Nano), e.Stored.Status, e.Stored.Fingerprint, e.Fingerprint)
}
