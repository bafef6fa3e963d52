package relay

import (
	"context"
	"errors"
	"fmt"
)

// Failures collects the failed messages of one Publish call and applies the
// order rule of the [Sink] contract: once a message of a key failed, the
// later messages of that key in the batch are not attempted but reported
// as [ErrSkipped]. Sinks build one per call with [NewFailures], ask
// [Failures.Skip] before sending a message, report errors with
// [Failures.Fail] and return [Failures.Err]. A Failures is not safe for
// concurrent use.
type Failures struct {
	batch  []Message
	failed map[int]error
	first  map[string]int // key -> lowest failed index
}

// NewFailures returns an empty Failures for batch.
func NewFailures(batch []Message) *Failures {
	return &Failures{batch: batch}
}

// Skip reports whether batch[i] must not be sent because an earlier message
// of its key failed; it then records [ErrSkipped] for i. Unkeyed messages
// are never skipped.
func (f *Failures) Skip(i int) bool {
	k := f.batch[i].Key
	if k == "" {
		return false
	}
	if first, ok := f.first[k]; ok && first < i {
		f.record(i, ErrSkipped)
		return true
	}
	return false
}

// Fail records err for batch[i] (a nil err is ignored); the later messages
// of its key are skipped from then on.
func (f *Failures) Fail(i int, err error) {
	if err == nil {
		return
	}
	f.record(i, err)
	if k := f.batch[i].Key; k != "" {
		if first, ok := f.first[k]; !ok || i < first {
			if f.first == nil {
				f.first = map[string]int{}
			}
			f.first[k] = i
		}
	}
}

func (f *Failures) record(i int, err error) {
	if f.failed == nil {
		f.failed = map[int]error{}
	}
	f.failed[i] = err
}

// Merge records err, the result of publishing a sub-batch whose j-th
// message is batch[index[j]]: nothing for nil, the listed failures of a
// *[PublishError], every message of the sub-batch otherwise. A
// PublishError that lists no failure or an index outside the sub-batch
// fails the whole sub-batch: a message is only taken as delivered when the
// Sink said so.
func (f *Failures) Merge(index []int, err error) {
	if err == nil {
		return
	}
	var pe *PublishError
	if errors.As(err, &pe) && pe.valid(len(index)) {
		for j, e := range pe.Failed {
			f.Fail(index[j], e)
		}
		return
	}
	for _, i := range index {
		f.Fail(i, err)
	}
}

// Failed returns the error recorded for batch[i], nil if none.
func (f *Failures) Failed(i int) error { return f.failed[i] }

// Len returns the number of failed messages.
func (f *Failures) Len() int { return len(f.failed) }

// Err is what Publish returns: nil when nothing failed, ctx.Err() when every
// message failed and ctx is done, a *[PublishError] otherwise.
func (f *Failures) Err(ctx context.Context) error {
	switch {
	case len(f.failed) == 0:
		return nil
	case len(f.failed) == len(f.batch) && ctx.Err() != nil:
		return ctx.Err()
	}
	return &PublishError{Failed: f.failed}
}

// valid reports whether e names at least one failure and only indexes of a
// batch of n messages, each with an error.
func (e *PublishError) valid(n int) bool {
	if len(e.Failed) == 0 {
		return false
	}
	for i, err := range e.Failed {
		if i < 0 || i >= n || err == nil {
			return false
		}
	}
	return true
}

// Rounds plans the publishing of batch when its messages go to several
// destinations (sinks, topics, subjects) that are written concurrently:
// the batch indexes of round r, in batch order, may all be sent at once,
// after every round before r finished. A keyed message moves to a later
// round than its key's previous message whenever destOf gives the two
// different destinations, so a key never has messages in flight to two
// destinations at once. Unkeyed messages and keys that stay with one
// destination all go in the first round.
func Rounds(batch []Message, destOf func(m *Message) string) [][]int {
	type keyState struct {
		dest  string
		round int
	}
	keys := map[string]keyState{}
	var rounds [][]int
	for i := range batch {
		m := &batch[i]
		round := 0
		if m.Key != "" {
			dest := destOf(m)
			st, seen := keys[m.Key]
			if seen && st.dest != dest {
				st.round++
			}
			st.dest = dest
			keys[m.Key] = st
			round = st.round
		}
		for len(rounds) <= round {
			rounds = append(rounds, nil)
		}
		rounds[round] = append(rounds[round], i)
	}
	return rounds
}

// ErrSinkPanicked is matched by the error the relay and a [Router] report
// for a batch whose Sink panicked. The batch fails as a whole and is
// retried or dead-lettered like any other failure.
var ErrSinkPanicked = errors.New("relay: sink panicked")

// publish calls s.Publish, turning a panic into an error.
func publish(ctx context.Context, s Sink, id BatchID, batch []Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrSinkPanicked, p)
		}
	}()
	return s.Publish(ctx, id, batch)
}
