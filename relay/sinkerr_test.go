package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// TestSinkPanicFailsTheBatch: a Sink that panics does not crash the
// process; its batch fails like any other failure (an attempt is counted)
// and is delivered by the next try.
func TestSinkPanicFailsTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	var failed atomic.Value
	rec := &recorder{fn: func(call int, batch []relay.Message) error {
		calls.Add(1)
		if call == 1 {
			panic("sink bug")
		}
		return nil
	}}
	cfg := relay.Config{Retry: idemq.Retry{BaseDelay: msDelay, MaxDelay: msDelay}, Hooks: relay.Hooks{OnFailed: func(e relay.FailedEvent) { failed.Store(e.Err) }}}
	enqueue(t, b, keyed("d", 3, 1, 0)...)
	run(t, newRelay(t, b, rec, cfg))
	idemqtest.WaitFor(t, "delivery after the panic", func() bool { return distinct(rec) == 3 && pending(t, b) == 0 })
	if err, _ := failed.Load().(error); !errors.Is(err, relay.ErrSinkPanicked) {
		t.Fatalf("failure reported as %v, want ErrSinkPanicked", err)
	}
	got := rec.deliveries()
	if len(got) != 3 || checkOrder(t, got) != 0 {
		t.Fatalf("%d deliveries, want 3 in order", len(got))
	}
	// The panic is the head's failed attempt; its followers were held back.
	for i, m := range got {
		want := 0
		if i == 0 {
			want = 1
		}
		if m.Attempts != want {
			t.Fatalf("message %q delivered with attempts %d, want %d", m.Payload, m.Attempts, want)
		}
	}
}

// TestMalformedPublishErrorLosesNothing: a Sink that returns a
// PublishError naming no failure (or indexes outside the batch) has not
// said which messages were delivered, so none is deleted: both are handed
// over again.
func TestMalformedPublishErrorLosesNothing(t *testing.T) {
	t.Parallel()
	for _, bad := range []*relay.PublishError{{}, {Failed: map[int]error{99: errors.New("boom")}}} {
		b := setup(t)
		var calls, handed atomic.Int64
		sink := relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
			handed.Add(int64(len(batch)))
			if calls.Add(1) == 1 {
				return bad
			}
			return nil
		})
		enqueue(t, b, outbox.Message{Destination: "d", Payload: []byte("x")}, outbox.Message{Destination: "d", Payload: []byte("y")})
		stop := run(t, newRelay(t, b, sink, relay.Config{Retry: idemq.Retry{BaseDelay: msDelay, MaxDelay: msDelay}}))
		idemqtest.WaitFor(t, "empty outbox", func() bool { return pending(t, b) == 0 })
		stop()
		if n := handed.Load(); n != 4 {
			t.Fatalf("%v: messages handed to the sink %d times, want 4 (both again after the malformed error)", bad, n)
		}
	}
}

// msDelay is a retry delay short enough for tests.
const msDelay = time.Millisecond

// TestSinkMutationsNeverReachTheTable: a Sink may change the messages it is
// handed; what is put back after a failure and what becomes a dead letter
// are the rows as enqueued.
func TestSinkMutationsNeverReachTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var seen []string         // headers and payload of every message handed over, before mutation
	tries := map[string]int{} // payload as enqueued -> hand-overs
	sink := relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
		mu.Lock()
		defer mu.Unlock()
		failed := map[int]error{}
		for i := range batch {
			m := &batch[i]
			orig := string(m.Payload)
			seen = append(seen, m.Headers["trace"]+"|"+orig)
			tries[orig]++
			m.Headers["trace"] = "mutated"
			m.Headers["extra"] = "added"
			copy(m.Payload, "XXXX")
			m.Key, m.Destination = "other", "elsewhere"
			switch {
			case tries[orig] == 1:
				failed[i] = errors.New("first try fails")
			case orig == "two!":
				failed[i] = idemq.Permanent(errors.New("no more"))
			}
		}
		if len(failed) == 0 {
			return nil
		}
		return &relay.PublishError{Failed: failed}
	})
	enqueue(t, b,
		outbox.Message{Destination: "d", Key: "k1", Payload: []byte("one!"), Headers: map[string]string{"trace": "t1"}},
	)
	enqueue(t, b,
		outbox.Message{Destination: "d", Key: "k2", Payload: []byte("two!"), Headers: map[string]string{"trace": "t2"}},
	)
	stop := run(t, newRelay(t, b, sink, relay.Config{BatchSize: 1, Retry: idemq.Retry{BaseDelay: msDelay, MaxDelay: msDelay}}))
	idemqtest.WaitFor(t, "a delivery and a dead letter", func() bool {
		st, err := b.ob.Stats(b.ctx)
		return err == nil && st.Pending == 0 && st.Dead == 1
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	// Each retry sees the message as enqueued, never the mutation.
	for _, s := range seen {
		if s != "t1|one!" && s != "t2|two!" {
			t.Fatalf("handed %q: a mutation was stored", s)
		}
	}
	if len(seen) != 4 {
		t.Fatalf("%d hand-overs, want 4", len(seen))
	}
	dl, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dl) != 1 || string(dl[0].Payload) != "two!" || dl[0].Key != "k2" || dl[0].Destination != "d" ||
		len(dl[0].Headers) != 1 || dl[0].Headers["trace"] != "t2" {
		t.Fatalf("dead letter %+v, want the message as enqueued", dl)
	}
}

// TestUndecodableHeadersDeadLetterOneRow: a row whose stored headers are
// not a JSON object (written by hand, not by Enqueue) becomes a dead letter
// on its own instead of failing every claim of its batch; a header value
// that is not a string is passed on as its JSON text.
func TestUndecodableHeadersDeadLetterOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue(t, b, outbox.Message{Destination: "d", Key: "k", Payload: []byte("k:0")})
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO `+b.table()+` (id, destination, key, payload, headers)
VALUES (gen_random_uuid(), 'd', 'bad', 'x', '[1]'), (gen_random_uuid(), 'd', 'num', 'num:0', '{"n": 1}')`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, b, outbox.Message{Destination: "d", Key: "k", Payload: []byte("k:1")}, outbox.Message{Destination: "d", Key: "bad", Payload: []byte("after")})
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{}))
	idemqtest.WaitFor(t, "the good rows delivered and the bad one dead", func() bool {
		st, err := b.ob.Stats(b.ctx)
		return err == nil && st.Pending == 0 && st.Dead == 1
	})
	got := rec.deliveries()
	if len(got) != 4 || checkOrder(t, got) != 0 {
		t.Fatalf("%d deliveries, want 4", len(got))
	}
	for _, m := range got {
		if m.Key == "num" && m.Headers["n"] != "1" {
			t.Fatalf("headers %v, want n=1", m.Headers)
		}
	}
	dl, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
	if err != nil || len(dl) != 1 || dl[0].Key != "bad" || !strings.Contains(dl[0].LastError, "stored headers") {
		t.Fatalf("dead letters %+v, %v", dl, err)
	}
}
