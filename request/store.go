package request

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq"
)

// Store keeps request records. Every method is safe for concurrent use by
// many processes sharing the store's backend; the conformance suite in
// package requesttest states the contract as tests.
//
// A record moves through the states of [State]: [Store.Claim] creates it
// (or takes it over) InProgress under a lease; [Store.Complete] makes it
// Completed with the response to replay; [Store.Release] hands the key back
// (Released) so the next claim runs the request again. Complete, Release and
// Extend are compare-and-set on the lease's fencing token.
type Store interface {
	// Claim takes id for a new attempt under a lease of the given duration
	// when the key is new, Released, or InProgress under a lease that ran
	// out (a takeover); the returned Claim.Lease then carries a fencing
	// token larger than any earlier claim of the key, also of a record
	// that expired or was collected since: tokens never go back, so a
	// stalled holder whose record was forgotten cannot finish or pass
	// downstream as the newest writer.
	//
	// Otherwise Claim.Record is the stored record: Completed (replay its
	// Response) or InProgress under a live lease (answer "in flight"). A
	// record whose fingerprint differs from fingerprint is reported as a
	// *ConflictError and never claimed. A store that cannot be reached
	// returns its error; callers then fail closed.
	Claim(ctx context.Context, id ID, fingerprint []byte, lease time.Duration) (Claim, error)

	// Complete stores resp as the final outcome of lease's attempt and
	// keeps the record for the store's record TTL from now. It fails with
	// [idemq.ErrLeaseLost] when the key was taken over or already finished; the
	// outcome of whoever holds the key then stands. A lease whose time ran
	// out may still complete while nobody has taken it over.
	Complete(ctx context.Context, lease idemq.Lease, resp Response) error

	// Release ends lease's attempt without an outcome, so that the next
	// Claim runs the request again. The record keeps its fingerprint and
	// fencing token. It fails with [idemq.ErrLeaseLost] like Complete.
	Release(ctx context.Context, lease idemq.Lease) error

	// Extend moves the end of lease to d from now and returns the extended
	// lease. It fails with [idemq.ErrLeaseLost] like Complete.
	Extend(ctx context.Context, lease idemq.Lease, d time.Duration) (idemq.Lease, error)

	// Get returns the record of id, or [ErrNotFound].
	Get(ctx context.Context, id ID) (Record, error)

	// RecordTTL is how long the store keeps a record after its last
	// change, at least; front ends advertise it.
	RecordTTL() time.Duration
}

// ResponseLimiter is implemented by a [Store] that cannot keep a response
// of any size (DynamoDB's items hold 400 KB). The Guard stores a larger
// response without its body and marks it Omitted, so that a replay never
// passes an empty body off as the original.
type ResponseLimiter interface {
	// MaxResponse is the largest encoded response (Response.MarshalBinary)
	// the store keeps, in bytes.
	MaxResponse() int
}

// RecordTTLDefault is the record TTL of every store: how long a completed
// request is replayed. Stripe keeps keys at least 24 hours.
const RecordTTLDefault = 24 * time.Hour

// State is where a record stands: InProgress -> Completed | Released.
type State uint8

const (
	// InProgress: an attempt holds the key until its lease runs out.
	InProgress State = 1
	// Completed: the response is stored; every retry gets it replayed.
	Completed State = 2
	// Released: the last attempt ended without an outcome (a 5xx, a
	// panic, a timeout); the next claim runs the request again.
	Released State = 3
)

func (s State) String() string {
	switch s {
	case InProgress:
		return "IN_PROGRESS"
	case Completed:
		return "COMPLETED"
	case Released:
		return "RELEASED"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Record is the stored state of one request key.
type Record struct {
	ID
	Fingerprint []byte
	State       State
	// Token is the fencing token of the latest claim.
	Token int64
	// LeaseUntil is when the current attempt's lease runs out; set while
	// InProgress.
	LeaseUntil time.Time
	// Response is set when Completed.
	Response *Response
	// ExpiresAt is when the store may forget the record, at the earliest.
	ExpiresAt time.Time
}

// Claim is the outcome of [Store.Claim].
type Claim struct {
	// Acquired reports that the caller holds Lease and must run the
	// request. Otherwise Record is the stored record.
	Acquired bool
	Lease    idemq.Lease
	Record   Record
}

var (
	// ErrNotFound reports that no record exists for the key: it is
	// idemq.ErrNotFound, as inbox.ErrNotFound is.
	ErrNotFound = idemq.ErrNotFound
	// ErrInvalidKey reports a key that breaks the format rules: empty, too
	// long, not printable ASCII, or not of the required form. The client
	// sent it: front ends answer 400 / INVALID_ARGUMENT.
	ErrInvalidKey = errors.New("request: invalid idempotency key")
	// ErrMisconfigured reports a scope or fingerprint that the server
	// derived and the store cannot take: a scope over [MaxScopeLen] bytes
	// or not printable ASCII, a fingerprint over [MaxFingerprintLen]
	// bytes. The client cannot fix it by retrying: front ends answer 500 /
	// INTERNAL and log the reason for the operator.
	ErrMisconfigured = errors.New("request: server misconfiguration")
)

// ConflictError reports a key that was first used with another request (a
// different fingerprint). The request is not run: the client reused a key
// it must not reuse.
type ConflictError struct {
	ID          ID
	Fingerprint []byte
	// Stored is the record the key already has.
	Stored Record
}

// Is makes every ConflictError match idemq.ErrConflict, as
// inbox.ConflictError does.
func (e *ConflictError) Is(target error) bool { return target == idemq.ErrConflict }

func (e *ConflictError) Error() string {
	return fmt.Sprintf("request: key %q of scope %q is %s for another request (fingerprint %x, this one %x)",
		e.ID.Key, e.ID.Scope, e.Stored.State, e.Stored.Fingerprint, e.Fingerprint)
}
