package inbound

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/lifecycle"
)

// Config configures a [Kernel].
type Config struct {
	// Retry spaces the waits of held messages that have no RetryAfter of
	// their own (a database outage, a failed dead-letter publish): its
	// BaseDelay and MaxDelay, full jitter, through [idemq.Retry.BackOff].
	Retry idemq.Retry
	// Redeliver: the client can hand one message back to the broker
	// (JetStream's NakWithDelay); see [Decide].
	Redeliver bool
	// Logger receives the outage's two lines and the dead-letter publish
	// failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// Kernel is a subscriber's settle policy: it turns results into a
// [Plan], spaces the holds with one backoff, and logs a database outage
// once when it begins and once when it ends, with the count of the
// messages that waited for it. One Kernel serves all the goroutines of a
// subscriber (a Kafka subscriber's partitions); it is safe for concurrent
// use.
type Kernel struct {
	cfg Config

	mu   sync.Mutex
	back *idemq.RetryBackOff // nil until a hold needs it; reset when nothing is held
	// The outage under way, if since is not zero: the ids of the
	// messages that waited for it.
	since  time.Time
	waited map[string]struct{}
}

// New returns a Kernel.
func New(cfg Config) *Kernel {
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return &Kernel{cfg: cfg}
}

// Plan decides results ([Decide]), fills in the plan's Delay from the
// backoff when the held result gave none, and notes the database's state:
// a hold it caused begins or continues an outage (msgs from Held on
// waited for it); a result the database gave ends one, unless its
// processing started before the outage began (another goroutine's round
// that finished just before the database went).
func (k *Kernel) Plan(started time.Time, msgs []*consumer.Message, results []consumer.Result) Plan {
	p := Decide(results, k.cfg.Redeliver)
	k.mu.Lock()
	defer k.mu.Unlock()
	if p.Held == len(results) {
		k.back = nil
	} else if p.Delay <= 0 {
		p.Delay = k.backoff()
	}
	if !p.Outage {
		if !k.since.IsZero() && started.After(k.since) && answered(results) {
			k.outageOver()
		}
		return p
	}
	if k.since.IsZero() {
		k.since, k.waited = time.Now(), map[string]struct{}{}
		k.cfg.Logger.Warn("idemq: database unavailable; holding the messages in order and retrying with backoff",
			slog.Any("error", results[p.Held].Err), slog.Duration("retry_in", p.Delay))
	}
	for _, m := range msgs[p.Held:] {
		if m != nil {
			k.waited[m.ID] = struct{}{}
		}
	}
	return p
}

// answered reports whether the database gave one of results: a settled
// outcome, a counted failure, a key another worker holds; not a shutdown
// or a message left alone.
func answered(results []consumer.Result) bool {
	for _, r := range results {
		if r.Outcome != consumer.Retry || r.Attempts > 0 || errors.Is(r.Err, consumer.ErrInProgress) {
			return true
		}
	}
	return false
}

// outageOver logs the end of the outage under way. k.mu is held.
func (k *Kernel) outageOver() {
	k.cfg.Logger.Info("idemq: database available again", slog.Duration("lasted", time.Since(k.since)), slog.Int("waited", len(k.waited)))
	k.since, k.waited = time.Time{}, nil
}

// Client is what only a subscriber's broker client can do with a plan.
type Client interface {
	// DeadLetter publishes the copies of msgs[i] for i in dead, in order,
	// to the dead-letter destination. It returns how many leading ones
	// were published and the error that stopped the rest.
	DeadLetter(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, dead []int) (int, error)
	// Settle carries out steps, the plan of msgs (a leading part of a
	// group, all but Hold): acknowledge, terminate after the dead-letter
	// copy, hand back; a Kafka client commits the offset after the last.
	// A non-nil error (a crash point's veto) stops the group at once.
	Settle(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, steps []Step) error
	// Release hands back msgs, held when the subscriber stopped (JetStream:
	// Nak, so they are redelivered now rather than after AckWait); a Kafka
	// client does nothing, its offset is not committed past them.
	Release(msgs []*consumer.Message)
}

// Process applies a group of messages through a consumer: results[i] is
// msgs[i]'s.
type Process func(ctx context.Context, msgs []*consumer.Message) []consumer.Result

// Processor returns the Process of c: consumer.ProcessBatch in batch mode,
// otherwise consumer.Process message by message, stopping at the first
// result the plan would hold (the messages behind it are [NotAttempted]).
func (k *Kernel) Processor(c *consumer.Consumer, batch bool) Process {
	if batch {
		return c.ProcessBatch
	}
	return func(ctx context.Context, msgs []*consumer.Message) []consumer.Result {
		results := make([]consumer.Result, len(msgs))
		for i, m := range msgs {
			results[i] = c.Process(ctx, m)
			if p := Decide(results[i:i+1], k.cfg.Redeliver); p.Held == 0 {
				for j := i + 1; j < len(results); j++ {
					results[j] = consumer.Result{Outcome: consumer.Retry, Err: errNotAttempted}
				}
				break
			}
		}
		return results
	}
}

// errNotAttempted marks the messages behind a held one that a per-message
// Process left alone.
var errNotAttempted = errors.New("idemq: an earlier message is held")

// NotAttempted reports a result of a message that a per-message Process
// did not attempt, because a message before it is held.
func notAttempted(r consumer.Result) bool { return errors.Is(r.Err, errNotAttempted) }

// Group processes msgs, in order, and settles them through cl, until
// none is held: held messages are processed again after the plan's
// delay, so no message overtakes one held before it. Processing and
// settling run under work; the waits end with wait (a shutdown, a
// rebalance), and then the held messages are released and Group returns
// wait's error. It returns cl.Settle's error at once.
//
// A dead letter whose copy could not be published is held with the
// messages behind it, and the ones before it settle. A message held after
// a counted failed attempt (the consumer's Redeliver mode) is one delivery
// more (consumer.Message.Delivery, where the client counts them); an
// outage, a shutdown or another worker's lease is not.
func (k *Kernel) Group(wait, work context.Context, msgs []*consumer.Message, process Process, cl Client) error {
	for len(msgs) > 0 {
		started := time.Now()
		results := process(work, msgs)
		p := k.Plan(started, msgs, results)
		if dead := p.DeadLetters(); len(dead) > 0 {
			if n, err := cl.DeadLetter(work, msgs, results, dead); err != nil {
				k.cfg.Logger.Warn("idemq: publish dead letter; it is held and published again", slog.String("key", results[dead[n]].Key), slog.Any("error", err))
				p = k.deadLetterFailed(p, dead[n])
			}
		}
		if p.Held > 0 {
			if err := cl.Settle(work, msgs[:p.Held], results[:p.Held], p.Settled()); err != nil {
				return err
			}
		}
		held := msgs[p.Held:]
		for i, m := range held {
			if r := results[p.Held+i]; m != nil && m.Delivery > 0 && r.Outcome == consumer.Retry && r.Attempts > 0 && !r.Unavailable {
				m.Delivery++
			}
		}
		if len(held) > 0 && lifecycle.Sleep(wait, p.Delay) != nil {
			cl.Release(held)
			return wait.Err()
		}
		msgs = held
	}
	return nil
}

// deadLetterFailed holds p from message i, whose dead-letter copy was
// not published, with the backoff's delay.
func (k *Kernel) deadLetterFailed(p Plan, i int) Plan {
	k.mu.Lock()
	defer k.mu.Unlock()
	p.holdFrom(i, k.backoff(), false)
	return p
}

// backoff returns the next wait of the holds under way: Retry's delays
// without its bounds, since a subscriber never gives up. k.mu is held.
func (k *Kernel) backoff() time.Duration {
	if k.back == nil {
		k.back = idemq.Retry{BaseDelay: k.cfg.Retry.BaseDelay, MaxDelay: k.cfg.Retry.MaxDelay}.BackOff()
	}
	return k.back.NextBackOff()
}
