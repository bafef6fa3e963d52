package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// TestFencing drives two workers of two relays by hand. A owns every
// partition and has a batch in flight when its lease expires: B's takeover
// skips the partitions A's batch holds, so it cannot take them until A's
// batch committed. Then B takes them over (new tokens), and A, stale,
// claims and publishes nothing more: its next batch sees the tokens it
// held are gone. B publishes the rest, and no message is published twice
// or out of order.
func TestFencing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs, outbox.Message{Destination: "d", Key: fmt.Sprint("k", i%10), Payload: fmt.Append(nil, i)})
	}
	if err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var published []Message
	calls := map[string]int{}
	inFlight, release := make(chan struct{}), make(chan struct{})
	sink := func(name string) Sink {
		return SinkFunc(func(_ context.Context, _ BatchID, batch []Message) error {
			mu.Lock()
			published = append(published, batch...)
			calls[name]++
			first := name == "A" && calls[name] == 1
			mu.Unlock()
			if first {
				close(inFlight)
				<-release
			}
			return nil
		})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newWorker := func(name string) *worker {
		r, err := New(pool, ob, sink(name), Config{BatchSize: 10, DisableListen: true, Logger: quiet, LeaseTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return handWorker(t, r)
	}
	a := newWorker("A")
	if err := a.rebalance(ctx); err != nil || len(a.leases) != 64 {
		t.Fatalf("A owns %d partitions (%v), want all 64", len(a.leases), err)
	}
	b := newWorker("B")

	done := make(chan error, 1)
	go func() {
		n, _, err := a.round(ctx, ctx)
		if err == nil && n != 10 {
			err = fmt.Errorf("A's batch claimed %d rows, want 10", n)
		}
		done <- err
	}()
	<-inFlight
	expire := func(w *worker) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE idemq_outbox_relays SET expires_at = now() - interval '1 second' WHERE owner = $1`, w.id); err != nil {
			t.Fatal(err)
		}
	}
	expire(a)
	if err := b.rebalance(ctx); err != nil || len(b.leases) != 0 {
		t.Fatalf("B took %d partitions (%v) while A's batch holds them, want 0", len(b.leases), err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.rebalance(ctx); err != nil || len(b.leases) != 64 {
		t.Fatalf("B owns %d partitions (%v) after A's batch, want all 64", len(b.leases), err)
	}
	for _, l := range b.leases {
		if l.token != 2 {
			t.Fatalf("partition %d has token %d after one takeover, want 2", l.part, l.token)
		}
	}

	// A is stale: it still believes it owns everything.
	if len(a.leases) != 64 {
		t.Fatalf("A forgot its leases early: %d", len(a.leases))
	}
	n, again, err := a.round(ctx, ctx)
	if err != nil || n != 0 || !again {
		t.Fatalf("stale A's batch: %d rows, again %v, %v; want 0 rows and again", n, again, err)
	}
	if len(a.leases) != 0 {
		t.Fatalf("stale A still believes it owns %d partitions", len(a.leases))
	}
	for {
		n, again, err := b.round(ctx, ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 && !again {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["A"] != 1 || calls["B"] == 0 {
		t.Fatalf("sink calls %v, want A once (the batch in flight) and B for the rest", calls)
	}
	seen := map[uuid.UUID]bool{}
	last := map[string]int{}
	for _, m := range published {
		if seen[m.ID] {
			t.Fatalf("message %s published twice", m.Payload)
		}
		seen[m.ID] = true
		var i int
		fmt.Sscan(string(m.Payload), &i)
		if l, ok := last[m.Key]; ok && i < l {
			t.Fatalf("key %s: %d published after %d", m.Key, i, l)
		}
		last[m.Key] = i
	}
	if len(seen) != 40 {
		t.Fatalf("%d messages published, want 40", len(seen))
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemq_outbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left (%v)", left, err)
	}
}

// TestReplayDuringTheOwnersBatch: a dead-letter Replay of a key bumps the
// gen of the key's partition without waiting for the partition's owner,
// whose batch is in flight, and the owner does not wait for it; the
// owner's next batch sees the lease's gen move, reads its partitions again
// from the start and publishes the replayed message, which its cursor had
// long passed.
func TestReplayDuringTheOwnersBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var delivered []string
	calls := 0
	inFlight, release := make(chan struct{}), make(chan struct{})
	sink := SinkFunc(func(_ context.Context, _ BatchID, batch []Message) error {
		mu.Lock()
		calls++
		call := calls
		mu.Unlock()
		switch call {
		case 1:
			return idemq.Permanent(errors.New("refused"))
		case 2:
			close(inFlight)
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		for _, m := range batch {
			delivered = append(delivered, string(m.Payload))
		}
		return nil
	})
	r, err := New(pool, ob, sink, Config{DisableListen: true, LeaseTTL: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	w := handWorker(t, r)
	if err := w.rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	drain := func() {
		t.Helper()
		for {
			n, again, err := w.round(ctx, ctx)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 && !again {
				return
			}
		}
	}
	enqueue := func(payloads ...string) {
		t.Helper()
		var msgs []outbox.Message
		for _, p := range payloads {
			msgs = append(msgs, outbox.Message{Destination: "d", Key: "k", Payload: []byte(p)})
		}
		if err := ob.Enqueue(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	enqueue("k:0")
	drain() // k:0 becomes a dead letter
	enqueue("k:1", "k:2")
	done := make(chan error, 1)
	go func() {
		_, _, err := w.round(ctx, ctx)
		done <- err
	}()
	<-inFlight
	if n, err := ob.Replay(ctx, outbox.DeadFilter{Key: "k"}); err != nil || n != 1 {
		t.Fatalf("replayed %d (%v), want 1", n, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	drain()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(delivered, []string{"k:1", "k:2", "k:0"}) {
		t.Fatalf("delivered %q, want k:1 and k:2, then the replayed k:0", delivered)
	}
}

// handWorker checks r's tables and returns a worker of r for a test to
// drive by hand, registered and alive for LeaseTTL, as Run would.
func handWorker(t *testing.T, r *Relay) *worker {
	t.Helper()
	ctx := context.Background()
	if err := r.preflight(ctx); err != nil {
		t.Fatal(err)
	}
	w := &worker{r: r, id: uuid.New(), win: newWindow(time.Time{})}
	beats, err := r.joinAll(ctx, []uuid.UUID{w.id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(beats.Close)
	return w
}
