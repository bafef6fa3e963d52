package inbound

import (
	"time"

	"github.com/idemq/idemq/consumer"
)

// Action is what a subscriber does with one processed message.
type Action int

const (
	// Ack: applied or a duplicate; acknowledge it (Kafka: commit past it).
	Ack Action = iota + 1
	// DeadLetter: a dead letter or a conflict; publish its copy to the
	// dead-letter destination, then acknowledge it (JetStream: Term).
	DeadLetter
	// Redeliver: hand the message back to the broker, which delivers it
	// again after Step.Delay (JetStream: NakWithDelay); the messages
	// behind it go on. Only for a client that can hand back one message
	// ([Config.Redeliver]) and a handler failure the consumer handed back.
	Redeliver
	// Hold: not settled; the message and every one behind it are kept and
	// processed again, in order, after Plan.Delay.
	Hold
)

// Step is the plan for one message.
type Step struct {
	Action Action
	// Delay is the wait before a Redeliver, from Result.RetryAfter.
	Delay time.Duration
}

// Plan is what a subscriber does with a processed group of messages.
type Plan struct {
	// Steps[i] is the plan for message i; every step from Held on is Hold.
	Steps []Step
	// Held is the index of the first held message, len(Steps) when none
	// is: the messages before it settle (Kafka commits past Held-1).
	Held int
	// Delay is the wait before the held messages are processed again: the
	// held result's RetryAfter, or, when that is 0, the subscriber's
	// backoff ([Kernel.Plan] fills it in).
	Delay time.Duration
	// Outage reports a hold the database caused (Result.Unavailable).
	Outage bool
}

// Settled returns the steps of the messages that settle: those before
// Held.
func (p Plan) Settled() []Step { return p.Steps[:p.Held] }

// DeadLetters returns the indexes of the settling messages to copy to the
// dead-letter destination, in order.
func (p Plan) DeadLetters() []int {
	var out []int
	for i, s := range p.Settled() {
		if s.Action == DeadLetter {
			out = append(out, i)
		}
	}
	return out
}

// holdFrom makes message i and every one after it held, waiting delay
// (0: the backoff's).
func (p *Plan) holdFrom(i int, delay time.Duration, outage bool) {
	for j := i; j < len(p.Steps); j++ {
		p.Steps[j] = Step{Action: Hold}
	}
	p.Held, p.Delay, p.Outage = i, delay, outage
}

// Decide makes the plan for results, the outcomes of a group of messages
// in their order, without I/O:
//
//   - Applied and Duplicate are acknowledged; DeadLettered and Conflict
//     are copied to the dead-letter destination and acknowledged;
//   - a Retry after a counted failed attempt (Result.Attempts > 0: a
//     handler failure the consumer hands back in its Redeliver mode,
//     which gives up order for the broker's redelivery schedule) is
//     handed back on its own after its RetryAfter where the client can
//     (redeliver, as JetStream's NakWithDelay);
//   - every other Retry holds its message and every one behind it, so
//     that no later message of its key overtakes it, whatever the cause:
//     the database (Result.Unavailable: all would fail alike), a key
//     another worker holds (after its RetryAfter, the lease's end), a
//     shutdown; and so does the first where the client cannot hand one
//     message back.
//
// A result not attempted (see [NotAttempted]) is held with the Retry
// before it.
func Decide(results []consumer.Result, redeliver bool) Plan {
	p := Plan{Steps: make([]Step, len(results)), Held: len(results)}
	for i, r := range results {
		switch {
		case r.Outcome == consumer.Applied || r.Outcome == consumer.Duplicate:
			p.Steps[i] = Step{Action: Ack}
		case r.Outcome == consumer.DeadLettered || r.Outcome == consumer.Conflict:
			p.Steps[i] = Step{Action: DeadLetter}
		case redeliver && r.Outcome == consumer.Retry && r.Attempts > 0 && !r.Unavailable:
			p.Steps[i] = Step{Action: Redeliver, Delay: r.RetryAfter}
		default:
			p.holdFrom(i, r.RetryAfter, r.Unavailable)
			return p
		}
	}
	return p
}
