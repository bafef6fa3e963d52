package inbox

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Status is where a record stands in the state machine
// IN_PROGRESS -> SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL.
type Status int16

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
	// Token is the fencing token of the latest leased claim ([Lease]), 0
	// when the key was never leased.
	Token int64
	// Failures counts the attempts whose handler failed. Crashes, lost
	// connections and cancelled contexts are not failures and never count.
	Failures  int
	Result    []byte
	LastError string
	// ErrorClass is the class of LastError (see [DeadGroup]) of a dead
	// letter listed by [Store.DeadLetters]; empty in other results.
	ErrorClass string
	// Superseded lists the fingerprints the key was applied with before a
	// released conflict handed it to Fingerprint (see
	// [Store.ReleaseConflicts]): their redeliveries are duplicates.
	Superseded [][]byte
	CreatedAt  time.Time
	UpdatedAt  time.Time
	ExpiresAt  time.Time
}

// Item is one key to claim, with the fingerprint of its payload.
type Item struct {
	Key         string
	Fingerprint []byte
}

// ClaimResult is the outcome of [Store.ClaimTx], [Store.BeginClaim] and
// [Store.DeadLetterTx].
type ClaimResult struct {
	// New reports that the caller now owns the key and must apply the
	// message. Otherwise Existing holds the stored record.
	New      bool
	Existing *Record
	// Failures counts the failed attempts before this claim (New only).
	Failures int
}

// BatchClaim is the outcome of one item of [Store.ClaimBatchTx].
type BatchClaim struct {
	ClaimResult
	// Err is the item's own error: a *ConflictError or an ErrInvalidKey.
	Err error
}

// AcquireResult is the outcome of [Store.Acquire].
type AcquireResult struct {
	ClaimResult
	// Lease is the caller's hold on the key when New.
	Lease Lease
}

// Lease is a leased worker's hold on a key.
type Lease struct {
	Scope string
	Key   string
	Owner string
	// Token is the fencing token: it grows with every claim and takeover
	// of the key, also across GC. Each claim sets it to the larger of the
	// previous token + 1 and the database's clock in Unix microseconds, so
	// a record GC deleted starts again above every token handed out before
	// (the record lived at least its retention since its last claim).
	// Pass it downstream so the far side can reject a writer whose lease
	// was taken over.
	Token int64
	Until time.Time
}

var (
	// ErrInvalidKey reports an empty key, a key over the limit, or one that
	// is not valid UTF-8 or contains NUL.
	ErrInvalidKey = errors.New("inbox: invalid key")
	// ErrLeaseLost reports a finalize or extend by a worker whose lease was
	// taken over (its fencing token is stale) or already finalized.
	ErrLeaseLost = errors.New("inbox: lease lost")
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

// against returns rec as a claim of key with fingerprint sees it: rec
// itself when the fingerprints match; a duplicate (Succeeded, with that
// fingerprint and no stored result) when the key was applied with it
// before a released conflict; otherwise rec and a *ConflictError.
func against(rec Record, key string, fingerprint []byte) (Record, error) {
	same := func(f []byte) bool { return string(f) == string(fingerprint) }
	switch {
	case same(rec.Fingerprint):
		return rec, nil
	case slices.ContainsFunc(rec.Superseded, same):
		rec.Status, rec.Fingerprint, rec.Result, rec.Owner, rec.LeaseUntil = Succeeded, fingerprint, nil, "", time.Time{}
		return rec, nil
	}
	return rec, &ConflictError{Key: key, Fingerprint: fingerprint, Stored: rec}
}

// maxFingerprint bounds a fingerprint: it is a digest, not a payload.
const maxFingerprint = 64

// Validate reports whether key and fingerprint are acceptable to the Store:
// ErrInvalidKey for an empty key, one over Config.MaxKeyLen bytes, or one
// that is not valid UTF-8 or contains NUL; an error for a fingerprint over
// 64 bytes.
func (s *Store) Validate(key string, fingerprint []byte) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > s.cfg.MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrInvalidKey, len(key), s.cfg.MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8 text", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains NUL at byte %d, which Postgres text cannot hold", ErrInvalidKey, strings.IndexByte(key, 0))
	case len(fingerprint) > maxFingerprint:
		return fmt.Errorf("inbox: fingerprint of %d bytes, want a digest of at most %d", len(fingerprint), maxFingerprint)
	}
	return nil
}

// keyID maps a key to the uuid the table is keyed by. A canonical UUID
// (lower case, not version 8) is stored as itself and needs no text;
// anything else becomes a version-8 UUID made of its SHA-256, and its text
// is stored beside it. Version 8 is reserved for derived ids so that a
// crafted UUID key can never collide with a derived one.
func keyID(key string) (id uuid.UUID, text *string) {
	if len(key) == 36 {
		if u, err := uuid.Parse(key); err == nil && u.Version() != 8 && u.String() == key {
			return u, nil
		}
	}
	sum := sha256.Sum256([]byte(key))
	copy(id[:], sum[:16])
	id[6] = id[6]&0x0f | 0x80 // version 8
	id[8] = id[8]&0x3f | 0x80 // RFC 9562 variant
	return id, &key
}
