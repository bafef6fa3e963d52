package consumer

import (
	"fmt"
	"time"
)

// Outcome is what became of a message; it tells the transport whether to
// acknowledge it.
type Outcome int

const (
	// Applied: the handler's effects and the inbox record committed.
	Applied Outcome = iota + 1
	// Duplicate: the key was applied before; nothing was done.
	Duplicate
	// Conflict: the key was seen before with another payload fingerprint;
	// the message was not applied, only recorded as a conflict in the
	// inbox (see inbox.Store.Conflicts). Err is an *inbox.ConflictError.
	Conflict
	// Retry: nothing was committed and the message should be redelivered
	// after RetryAfter (a retryable failure in Redeliver mode, a cancelled
	// context, an unreachable database, a key leased elsewhere).
	// Result.Unavailable tells a database failure from the others.
	Retry
	// DeadLettered: the message failed for good (permanent error, attempts
	// or time exhausted, invalid input) and was recorded as a dead letter.
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflict"
	case Retry:
		return "retry"
	case DeadLettered:
		return "dead-lettered"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result reports the processing of one message.
type Result struct {
	Outcome Outcome
	// Key is the idempotency key ("" when it could not be derived).
	Key string
	// Err is the cause of a Conflict, Retry or DeadLettered outcome.
	Err error
	// RetryAfter is how long a transport should wait before redelivering a
	// Retry; 0 leaves the wait to the transport's backoff.
	RetryAfter time.Duration
	// Unavailable marks a Retry that the database caused, not the message:
	// it could not be reached, lost the connection, or refused the
	// transaction for a reason of its own (a serialization failure, a
	// server shutting down), while the context was still live. Nothing was
	// applied and no attempt was counted, and every message would fail
	// alike: a transport keeps the message and those behind it, in order,
	// and waits with a capped backoff instead of redelivering it at once,
	// and reports the outage once rather than once per message (the
	// consumer logs such a result at Debug level, other Retries at Warn).
	Unavailable bool
	// Attempts counts the attempts at the message as the inbox records
	// them, across deliveries and processes: its failed attempts, plus the
	// one that succeeded for Applied. A crash, a lost connection or a
	// cancelled context is not an attempt.
	Attempts int
	// Duration is the time the call spent on the message.
	Duration time.Duration
}

// Settled reports whether the transport should acknowledge the message
// (commit the offset, Ack or Term): true for every outcome but Retry.
func (r Result) Settled() bool { return r.Outcome != Retry }
