package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
)

// TestPartitionedInboxLeftAloneKeepsAcceptingClaims: a partitioned inbox
// whose consumer runs its Maintenance service keeps applying messages for
// three partition intervals and more with nobody calling GC; without it
// (the control) claims run out of partitions within those intervals and
// say so (ErrNoPartition, retryable), never a raw SQLSTATE.
func TestPartitionedInboxLeftAloneKeepsAcceptingClaims(t *testing.T) {
	t.Parallel()
	const interval = 2 * time.Second
	for _, maintained := range []bool{true, false} {
		t.Run(fmt.Sprintf("maintained=%v", maintained), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			c := newConsumer(t, pool, insertOrder, consumer.Config{Inbox: inbox.Config{
				Partitioning: inbox.PartitionByArrival, PartitionInterval: interval, Retention: interval, BoundaryGrace: 100 * time.Millisecond}})
			ctx := context.Background()
			if maintained {
				m, err := c.Maintenance()
				if err != nil {
					t.Fatal(err)
				}
				running, err := idemq.Start(ctx, m)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if err := running.Stop(); err != nil {
						t.Error(err)
					}
				})
			}
			start := time.Now()
			end := start.Add(3*interval + interval/2)
			for i := 0; time.Now().Before(end); i++ {
				r := c.Process(ctx, msg(fmt.Sprintf("order-%d", i), "p"))
				switch {
				case r.Outcome == consumer.Applied:
				case !maintained && errors.Is(r.Err, inbox.ErrNoPartition):
					return // the control ran out of partitions, as expected
				default:
					t.Fatalf("message %d after %v: %+v, want Applied", i, time.Since(start).Round(time.Millisecond), r)
				}
				time.Sleep(interval / 8)
			}
			if !maintained {
				t.Fatalf("without maintenance, claims still found partitions after %v: the test proves nothing", 3*interval+interval/2)
			}
		})
	}
}
