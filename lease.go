package idemq

import (
	"errors"
	"time"
)

// Lease is a fenced hold on one key: an inbox key in leased mode
// (inbox.Store.Acquire, consumer.NewLeased) or a request key under an
// attempt (request.Store.Claim). Whoever holds it may work on the key until
// Until; every finalize and extension is a compare-and-set on Token, so a
// holder whose lease was taken over is refused with [ErrLeaseLost] and can
// never overwrite its successor's outcome.
type Lease struct {
	// Scope and Key name the key: the consumer's name or the request's
	// tenant, and the idempotency key.
	Scope string
	Key   string
	// Token is the fencing token: it grows with every claim and takeover
	// of the key, also across the record's expiry and garbage collection
	// (a store starts a new record above every token it handed out
	// before). Pass it downstream so the far side can refuse a writer
	// whose lease was taken over too.
	Token int64
	// Until is when the lease runs out unless extended.
	Until time.Time
}

// ErrLeaseLost reports a finalize or an extension by a holder whose lease
// was taken over (its fencing token is stale) or already finalized, and a
// relay batch fenced off because its partition leases may have run out.
// The successor's outcome stands.
var ErrLeaseLost = errors.New("idemq: lease lost")

// ErrNotFound reports that a store has no record of the key: the inbox
// (inbox.ErrNotFound) and the request stores (request.ErrNotFound) name
// this one error, so a caller tells "never seen" apart the same way
// whichever store it asked.
var ErrNotFound = errors.New("idemq: record not found")

// ErrConflict is matched (with errors.Is) by every error that reports a
// key reused with another payload: inbox.ConflictError (a message) and
// request.ConflictError (a request). Each type carries its own record;
// the meaning, never applied and never silently skipped, is one.
var ErrConflict = errors.New("idemq: key reused with another payload")
