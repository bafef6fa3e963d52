package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
)

// A dead letter an operator releases is applied by its next delivery, once.
func TestReleasedDeadLetterIsAppliedByItsNextDelivery(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var fixed atomic.Bool
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		if !fixed.Load() {
			return idemq.Permanent(errors.New("unknown product"))
		}
		return nil
	}, consumer.Config{})
	ctx := context.Background()
	if r := c.Process(ctx, msg("order-1", "p")); r.Outcome != consumer.DeadLettered {
		t.Fatalf("first delivery: %+v", r)
	}
	if r := c.Process(ctx, msg("order-1", "p")); r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrDeadLetter) {
		t.Fatalf("redelivery of a dead letter: %+v", r)
	}
	dead, err := c.Store().DeadLetters(ctx, inbox.DeadFilter{Scope: c.Scope()})
	if err != nil || len(dead) != 1 || dead[0].Key != "order-1" {
		t.Fatalf("dead letters %+v, %v", dead, err)
	}

	fixed.Store(true) // the bug is fixed and deployed
	if n, err := c.Store().Release(ctx, inbox.DeadFilter{Scope: c.Scope(), Key: "order-1"}); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	if r := c.Process(ctx, msg("order-1", "p")); r.Outcome != consumer.Applied || r.Attempts != 1 {
		t.Fatalf("delivery after the release: %+v, want Applied", r)
	}
	if r := c.Process(ctx, msg("order-1", "p")); r.Outcome != consumer.Duplicate {
		t.Fatalf("delivery after that: %+v, want Duplicate", r)
	}
	if n := orders(t, pool); n != 1 {
		t.Fatalf("%d business rows, want 1", n)
	}
	if st, err := c.Store().Stats(ctx); err != nil || st.Dead != 0 || st.Succeeded != 1 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

// A conflict is recorded in the inbox, counted and listed; released, the
// conflicting message's next delivery is applied once and the original
// payload stays a duplicate (both deliveries tested afterwards, through
// two releases); purged, it is forgotten.
func TestConflictsAreRecordedReleasedAndPurged(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			c := newConsumer(t, pool, insertOrder, consumer.Config{})
			ctx := context.Background()
			process := func(m *consumer.Message) consumer.Result {
				if batch {
					return c.ProcessBatch(ctx, []*consumer.Message{m})[0]
				}
				return c.Process(ctx, m)
			}
			for _, id := range []string{"order-1", "order-2"} {
				if r := process(msg(id, "pay 10")); r.Outcome != consumer.Applied {
					t.Fatalf("first %s: %+v", id, r)
				}
			}
			for range 2 {
				if r := process(msg("order-1", "pay 99")); r.Outcome != consumer.Conflict {
					t.Fatalf("reused key: %+v, want Conflict", r)
				}
			}
			if r := process(msg("order-2", "pay 50")); r.Outcome != consumer.Conflict {
				t.Fatalf("reused key: %+v, want Conflict", r)
			}
			conflicts, err := c.Store().Conflicts(ctx, inbox.DeadFilter{Scope: c.Scope()})
			if err != nil || len(conflicts) != 2 || conflicts[0].Key != "order-1" || conflicts[0].Seen != 2 {
				t.Fatalf("conflicts %+v, %v; want order-1 seen twice and order-2", conflicts, err)
			}
			if st, err := c.Store().Stats(ctx); err != nil || st.Conflicts != 2 {
				t.Fatalf("stats %+v, %v", st, err)
			}

			// The operator accepts order-1's new payload and drops order-2's.
			if n, err := c.Store().Release(ctx, inbox.DeadFilter{Conflicts: true, Key: "order-1"}); err != nil || n != 1 {
				t.Fatalf("release: %d, %v", n, err)
			}
			if n, err := c.Store().Purge(ctx, inbox.DeadFilter{Conflicts: true, Key: "order-2"}); err != nil || n != 1 {
				t.Fatalf("purge: %d, %v", n, err)
			}
			if r := process(msg("order-1", "pay 99")); r.Outcome != consumer.Applied {
				t.Fatalf("released conflict redelivered: %+v, want Applied", r)
			}
			if r := process(msg("order-1", "pay 99")); r.Outcome != consumer.Duplicate {
				t.Fatalf("and again: %+v, want Duplicate", r)
			}
			// The payload applied before the release stays applied: a
			// duplicate, not a new conflict that a second release would
			// apply twice.
			for range 2 {
				if r := process(msg("order-1", "pay 10")); r.Outcome != consumer.Duplicate {
					t.Fatalf("original payload after the release: %+v, want Duplicate", r)
				}
			}
			if r := process(msg("order-1", "pay 7")); r.Outcome != consumer.Conflict {
				t.Fatalf("a third payload: %+v, want Conflict", r)
			}
			if n, err := c.Store().Release(ctx, inbox.DeadFilter{Conflicts: true, Key: "order-1"}); err != nil || n != 1 {
				t.Fatalf("second release: %d, %v", n, err)
			}
			for _, p := range []string{"pay 7", "pay 7", "pay 99", "pay 10"} {
				if r := process(msg("order-1", p)); r.Outcome == consumer.Conflict || (p != "pay 7" && r.Outcome != consumer.Duplicate) {
					t.Fatalf("%q after the second release: %+v", p, r)
				}
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE id = 'order-1' AND payload = 'pay 7'`); n != 1 {
				t.Fatalf("the second released payload was applied %d times, want once", n)
			}
			if r := process(msg("order-2", "pay 10")); r.Outcome != consumer.Duplicate {
				t.Fatalf("purged conflict's key keeps its record: %+v, want Duplicate", r)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE payload = 'pay 99'`); n != 1 {
				t.Fatalf("the released payload was applied %d times, want once", n)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE payload = 'pay 10'`); n != 2 {
				t.Fatalf("the original payloads were applied %d times, want twice (order-1 and order-2 once each)", n)
			}
			if n := orders(t, pool); n != 4 {
				t.Fatalf("%d business rows, want 4", n)
			}
			if st, err := c.Store().Stats(ctx); err != nil || st.Conflicts != 0 {
				t.Fatalf("stats after release and purge %+v, %v", st, err)
			}
		})
	}
}
