package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
)

// insertOrders is insertOrder for a whole batch: one statement.
func insertOrders(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids, payloads := make([]string, len(msgs)), make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], payloads[i] = m.ID, string(m.Payload)
	}
	_, err := tx.Exec(ctx, `INSERT INTO orders (id, payload) SELECT * FROM unnest($1::text[], $2::text[])`, ids, payloads)
	return err
}

// calls records the ids each call of a batch handler received.
type calls struct {
	mu   sync.Mutex
	seen [][]string
}

func (c *calls) record(msgs []*consumer.Message) {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = append(c.seen, ids)
}

func (c *calls) take() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.seen
	c.seen = nil
	return seen
}

func newBatched(t *testing.T, pool *pgxpool.Pool, h consumer.BatchHandler) *consumer.Consumer {
	t.Helper()
	c, err := consumer.NewBatched(pool, "billing", h, consumer.Config{
		Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// The batch handler is called once, with exactly the messages new to the
// inbox: an earlier message, a repeated key and a conflict never reach it.
func TestBatchHandlerSeesOnlyNewMessages(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var got calls
	c := newBatched(t, pool, func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		got.record(msgs)
		return insertOrders(ctx, tx, msgs)
	})
	ctx := context.Background()
	if r := c.Process(ctx, msg("seen", "v1")); r.Outcome != consumer.Applied {
		t.Fatal(r)
	}
	if calls := got.take(); !slices.EqualFunc(calls, [][]string{{"seen"}}, slices.Equal) {
		t.Fatalf("Process called the batch handler with %v, want [[seen]]", calls)
	}
	batch := []*consumer.Message{msg("a", "p"), msg("seen", "v1"), msg("a", "p"), msg("seen", "v2"), msg("b", "p"), msg("c", "p")}
	want := []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.Duplicate, consumer.Conflict, consumer.Applied, consumer.Applied}
	for i, r := range c.ProcessBatch(ctx, batch) {
		if r.Outcome != want[i] || (r.Outcome == consumer.Applied && r.Attempts != 1) {
			t.Errorf("message %d: %+v, want %v", i, r, want[i])
		}
	}
	if calls := got.take(); !slices.EqualFunc(calls, [][]string{{"a", "b", "c"}}, slices.Equal) {
		t.Fatalf("batch handler calls %v, want one with [a b c]", calls)
	}
	if n := orders(t, pool); n != 4 {
		t.Fatalf("%d business rows, want 4 (seen, a, b, c)", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT tx) FROM orders WHERE id <> 'seen'`); n != 1 {
		t.Fatalf("the batch's rows come from %d transactions, want 1", n)
	}
	// Redelivered, nothing is new: the handler is not called at all.
	for i, r := range c.ProcessBatch(ctx, batch) {
		want := consumer.Duplicate
		if i == 3 {
			want = consumer.Conflict
		}
		if r.Outcome != want {
			t.Errorf("redelivered message %d: %+v, want %v", i, r, want)
		}
	}
	if calls := got.take(); len(calls) != 0 {
		t.Fatalf("batch handler called with %v for a redelivered batch", calls)
	}
	if n := orders(t, pool); n != 4 {
		t.Fatalf("%d business rows after redelivery, want 4", n)
	}
}

// A batch whose handler fails is applied again message by message: the
// poison message is dead-lettered alone, a transient failure is retried,
// and the rest commit together, each exactly once.
func TestBatchHandlerFailureIsolatesThePoisonMessage(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var got calls
	var transient sync.Once
	c := newBatched(t, pool, func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		got.record(msgs)
		if err := insertOrders(ctx, tx, msgs); err != nil {
			return err
		}
		for _, m := range msgs {
			switch m.ID {
			case "m-42":
				_, err := tx.Exec(ctx, `SELECT 1/0`) // aborts the transaction, not just the call
				return idemq.Permanent(err)
			case "m-7":
				if len(msgs) == 1 {
					var err error
					transient.Do(func() { err = errors.New("transient") })
					return err
				}
			}
		}
		return nil
	})
	batch := make([]*consumer.Message, 100)
	for i := range batch {
		batch[i] = msg(fmt.Sprintf("m-%d", i), "p")
	}
	results := c.ProcessBatch(context.Background(), batch)
	for i, r := range results {
		switch {
		case i == 42:
			if r.Outcome != consumer.DeadLettered || r.Attempts != 1 {
				t.Errorf("poison message: %+v, want dead-lettered after 1 attempt", r)
			}
		case i == 7:
			if r.Outcome != consumer.Applied || r.Attempts != 2 {
				t.Errorf("transient failure: %+v, want applied on attempt 2", r)
			}
		case r.Outcome != consumer.Applied || r.Attempts != 1:
			t.Errorf("message %d: %+v, want applied on attempt 1", i, r)
		}
	}
	calls := got.take()
	if len(calls) != 1+100+1 || len(calls[0]) != 100 {
		t.Fatalf("%d handler calls (first with %d messages), want the batch, each message alone, m-7 again", len(calls), len(calls[0]))
	}
	if n := orders(t, pool); n != 99 {
		t.Fatalf("%d business rows, want 99", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE id = 'm-42'`); n != 0 {
		t.Fatal("the poison message's write survived")
	}
	if n := count(t, pool, `SELECT count(DISTINCT tx) FROM orders WHERE id <> 'm-7'`); n != 1 {
		t.Fatalf("the batch's rows come from %d transactions, want 1", n)
	}
}

// Per-message handlers in a batch run in one pass until one fails: the
// failing handler runs once per attempt, the ones before it run again
// (their first writes went with the failure's rollback), the ones after it
// run under savepoints of their own, and every message is applied once.
func TestBatchPassStopsAtTheFirstFailure(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var mu sync.Mutex
	calls := map[string]int{}
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		calls[m.ID]++
		n := calls[m.ID]
		mu.Unlock()
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "b" && n == 1 {
			return errors.New("transient")
		}
		return nil
	}, consumer.Config{})
	results := c.ProcessBatch(context.Background(), []*consumer.Message{msg("a", "p"), msg("b", "p"), msg("c", "p"), msg("d", "p")})
	for _, r := range results {
		want := 1
		if r.Key == "b" {
			want = 2
		}
		if r.Outcome != consumer.Applied || r.Attempts != want {
			t.Errorf("%+v, want applied on attempt %d", r, want)
		}
	}
	if want := map[string]int{"a": 2, "b": 2, "c": 1, "d": 1}; !maps.Equal(calls, want) {
		t.Errorf("handler calls %v, want %v", calls, want)
	}
	if n := count(t, pool, `SELECT count(DISTINCT id) FROM orders`); n != 4 || orders(t, pool) != 4 {
		t.Fatalf("%d business rows, %d distinct, want 4 once each", orders(t, pool), n)
	}
}
