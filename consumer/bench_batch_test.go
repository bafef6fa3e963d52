package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
)

// BenchmarkBatchHandler measures the batch modes, in one run and 100
// messages per batch: Process one by one ("per-message"), the business inserts batched in
// plain SQL (BEGIN, 100 INSERTs, COMMIT: "plain-sql-batch"), ProcessBatch
// with a per-message handler ("batch") and ProcessBatch with a batch
// handler that inserts all rows in one statement ("batch-handler").
// ratio = batch-handler / per-message; batch/plain-sql compares the
// per-message handlers in a batch with the same statements without the
// inbox.
func BenchmarkBatchHandler(b *testing.B) {
	pool, c := benchConsumer(b)
	ctx := context.Background()
	batched, err := consumer.NewBatched(pool, "bench-batched", insertOrders, consumer.Config{})
	if err != nil {
		b.Fatal(err)
	}
	inBatches := func(msgs []*consumer.Message, apply func([]*consumer.Message) error) time.Duration {
		start := time.Now()
		for i := 0; i < len(msgs); i += 100 {
			if err := apply(msgs[i:min(i+100, len(msgs))]); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	processBatch := func(c *consumer.Consumer) func([]*consumer.Message) error {
		return func(batch []*consumer.Message) error {
			for _, r := range c.ProcessBatch(ctx, batch) {
				if r.Outcome != consumer.Applied {
					return fmt.Errorf("%v: %v", r.Outcome, r.Err)
				}
			}
			return nil
		}
	}
	variants := []func(msgs []*consumer.Message) time.Duration{
		func(msgs []*consumer.Message) time.Duration {
			return elapsed(b, msgs, 1, func(m *consumer.Message) error {
				if r := c.Process(ctx, m); r.Outcome != consumer.Applied {
					return fmt.Errorf("%v: %v", r.Outcome, r.Err)
				}
				return nil
			})
		},
		func(msgs []*consumer.Message) time.Duration {
			return inBatches(msgs, func(batch []*consumer.Message) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					for _, m := range batch {
						if err := insertOrder(ctx, tx, m); err != nil {
							return err
						}
					}
					return nil
				})
			})
		},
		func(msgs []*consumer.Message) time.Duration { return inBatches(msgs, processBatch(c)) },
		func(msgs []*consumer.Message) time.Duration { return inBatches(msgs, processBatch(batched)) },
	}
	rates := compare(b, max(b.N, 1000), []string{"per-message", "plain-sql-batch", "batch", "batch-handler"}, func(v int, msgs []*consumer.Message) time.Duration {
		return variants[v](msgs)
	})
	b.ReportMetric(rates[2]/rates[1], "batch/plain-sql")
}
