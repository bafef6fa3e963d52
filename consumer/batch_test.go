package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
)

func slogJSON(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// 100 messages, 3 of whose handlers fail after writing: the 97 commit
// together, the 3 leave no trace in that transaction and are then retried
// (two recover) or dead-lettered (one is poison).
func TestBatchWithFailingMessages(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var failures atomic.Int32
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		switch m.ID {
		case "m-13", "m-57":
			if failures.Add(1) <= 2 {
				return errors.New("transient")
			}
		case "m-88":
			_, err := tx.Exec(ctx, `SELECT 1/0`) // aborts the transaction, not just the message
			return idemq.Permanent(err)
		}
		return nil
	}, consumer.Config{})
	batch := make([]*consumer.Message, 100)
	for i := range batch {
		batch[i] = msg(fmt.Sprintf("m-%d", i), "p")
	}
	results := c.ProcessBatch(context.Background(), batch)

	outcomes := map[consumer.Outcome]int{}
	for _, r := range results {
		outcomes[r.Outcome]++
	}
	if outcomes[consumer.Applied] != 99 || outcomes[consumer.DeadLettered] != 1 || results[88].Outcome != consumer.DeadLettered {
		t.Fatalf("outcomes %v, m-88 %v", outcomes, results[88])
	}
	if results[13].Attempts != 2 || results[57].Attempts != 2 {
		t.Fatalf("retried messages: %+v %+v, want applied on attempt 2", results[13], results[57])
	}
	if n := orders(t, pool); n != 99 {
		t.Fatalf("%d business rows, want 99", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE id = 'm-88'`); n != 0 {
		t.Fatal("the poison message's write survived")
	}
	// The 97 that did not fail committed in one transaction.
	if n := count(t, pool, `SELECT count(DISTINCT tx) FROM orders WHERE id NOT IN ('m-13', 'm-57')`); n != 1 {
		t.Fatalf("the batch's rows come from %d transactions, want 1", n)
	}
	// Redelivering the whole batch applies nothing.
	for i, r := range c.ProcessBatch(context.Background(), batch) {
		want := consumer.Duplicate
		if i == 88 {
			want = consumer.DeadLettered
		}
		if r.Outcome != want {
			t.Fatalf("redelivered message %d: %+v, want %v", i, r, want)
		}
	}
	if n := orders(t, pool); n != 99 {
		t.Fatalf("%d business rows after redelivery, want 99", n)
	}
}

func TestBatchWithRepeatedKeysAndConflicts(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, insertOrder, consumer.Config{})
	ctx := context.Background()
	if r := c.Process(ctx, msg("seen", "v1")); r.Outcome != consumer.Applied {
		t.Fatal(r)
	}
	results := c.ProcessBatch(ctx, []*consumer.Message{
		msg("a", "p"), msg("a", "p"), msg("seen", "v1"), msg("seen", "v2"), msg("b", "p"), msg("a", "p"),
	})
	want := []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.Duplicate, consumer.Conflict, consumer.Applied, consumer.Duplicate}
	for i, r := range results {
		if r.Outcome != want[i] {
			t.Errorf("message %d: %v (%v), want %v", i, r.Outcome, r.Err, want[i])
		}
	}
	results = c.ProcessBatch(ctx, []*consumer.Message{msg("seen", "v2"), msg("c", "p")})
	if results[0].Outcome != consumer.Conflict || results[1].Outcome != consumer.Applied {
		t.Fatalf("conflict in a batch: %+v", results)
	}
	if n := orders(t, pool); n != 4 {
		t.Fatalf("%d business rows, want 4 (seen, a, b, c)", n)
	}
}

// Concurrent batches that share keys never apply one twice and never
// deadlock: claims lock keys in one order.
func TestConcurrentOverlappingBatches(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, insertOrder, consumer.Config{})
	var applied atomic.Int32
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for round := range 10 {
				batch := make([]*consumer.Message, 50)
				for i := range batch {
					batch[i] = msg(fmt.Sprintf("k-%d", (i*7+w*13+round)%120), "p")
				}
				for _, r := range c.ProcessBatch(context.Background(), batch) {
					switch r.Outcome {
					case consumer.Applied:
						applied.Add(1)
					case consumer.Duplicate:
					default:
						t.Errorf("worker %d: %v %v", w, r.Outcome, r.Err)
					}
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
	distinct := count(t, pool, `SELECT count(DISTINCT id) FROM orders`)
	if n := orders(t, pool); n != distinct || int(applied.Load()) != n {
		t.Fatalf("%d business rows, %d distinct keys, %d reported applied", n, distinct, applied.Load())
	}
}

// In Redeliver mode a batch's failed attempt counts in the inbox like
// Process's: a message failing on every delivery is dead-lettered on its
// MaxAttempts-th failure either way.
func TestRedeliverCountsTheDeliveryInBatchesToo(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, func(context.Context, pgx.Tx, *consumer.Message) error {
		return errors.New("always fails")
	}, consumer.Config{Redeliver: true, Retry: idemq.Retry{MaxAttempts: 3}})
	ctx := context.Background()
	for delivery := 1; delivery <= 3; delivery++ {
		single := c.Process(ctx, &consumer.Message{ID: "single", Payload: []byte("p"), Delivery: delivery})
		batched := c.ProcessBatch(ctx, []*consumer.Message{{ID: "batched", Payload: []byte("p"), Delivery: delivery}})[0]
		want := consumer.Retry
		if delivery == 3 {
			want = consumer.DeadLettered
		}
		if single.Outcome != want || batched.Outcome != want || single.Attempts != delivery || batched.Attempts != delivery {
			t.Fatalf("delivery %d: Process %v (attempt %d), ProcessBatch %v (attempt %d); want %v",
				delivery, single.Outcome, single.Attempts, batched.Outcome, batched.Attempts, want)
		}
	}
}

// The transport's delivery count is only a far backstop in Redeliver mode:
// a message delivered more than RedeliverBackstop × MaxAttempts times (one
// that kills its consumer every time) is dead-lettered without running
// the handler again; below that it is applied.
func TestRedeliverBackstop(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var calls atomic.Int32
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.Add(1)
		return insertOrder(ctx, tx, m)
	}, consumer.Config{Redeliver: true, Retry: idemq.Retry{MaxAttempts: 2}})
	ctx := context.Background()
	limit := consumer.RedeliverBackstop * 2
	if r := c.Process(ctx, &consumer.Message{ID: "a", Payload: []byte("p"), Delivery: limit}); r.Outcome != consumer.Applied {
		t.Fatalf("delivery %d: %+v, want Applied", limit, r)
	}
	for i, process := range []func(*consumer.Message) consumer.Result{
		func(m *consumer.Message) consumer.Result { return c.Process(ctx, m) },
		func(m *consumer.Message) consumer.Result { return c.ProcessBatch(ctx, []*consumer.Message{m})[0] },
	} {
		m := &consumer.Message{ID: fmt.Sprint("b", i), Payload: []byte("p"), Delivery: limit + 1}
		if r := process(m); r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrTooManyDeliveries) {
			t.Fatalf("delivery %d: %+v, want DeadLettered with ErrTooManyDeliveries", limit+1, r)
		}
	}
	if calls.Load() != 1 || orders(t, pool) != 1 {
		t.Fatalf("%d handler calls, %d rows; want the handler run only below the backstop", calls.Load(), orders(t, pool))
	}
}
