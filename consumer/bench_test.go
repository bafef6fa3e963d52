package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
)

// benchPool is a pool on a fresh database with room for 16 workers.
func benchPool(b *testing.B) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool
}

func benchMessages(n int) []*consumer.Message {
	msgs := make([]*consumer.Message, n)
	for i := range msgs {
		msgs[i] = &consumer.Message{ID: uuid.Must(uuid.NewV7()).String(), Payload: []byte(`{"order":42,"amount":"10.00"}`)}
	}
	return msgs
}

// rate runs apply over msgs from workers goroutines and returns messages/s.
func rate(b *testing.B, msgs []*consumer.Message, workers int, apply func(*consumer.Message) error) float64 {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(msgs)); i = next.Add(1) - 1 {
				if err := apply(msgs[i]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(len(msgs)) / time.Since(start).Seconds()
}

// BenchmarkProcess compares one transaction per message through the inbox
// with the same handler and business insert without it (BEGIN, INSERT,
// COMMIT), measured in the same run; ratio = inbox / baseline.
func BenchmarkProcess(b *testing.B) {
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			pool := benchPool(b)
			ctx := context.Background()
			c, err := consumer.New(pool, "bench", insertOrder, consumer.Config{})
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			n := max(b.N, 200)
			b.ResetTimer()
			baseline := rate(b, benchMessages(n), workers, func(m *consumer.Message) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return insertOrder(ctx, tx, m) })
			})
			inbox := rate(b, benchMessages(n), workers, func(m *consumer.Message) error {
				if r := c.Process(ctx, m); r.Outcome != consumer.Applied {
					return fmt.Errorf("%v: %v", r.Outcome, r.Err)
				}
				return nil
			})
			b.ReportMetric(baseline, "baseline-msg/s")
			b.ReportMetric(inbox, "inbox-msg/s")
			b.ReportMetric(inbox/baseline, "ratio")
		})
	}
}

// BenchmarkProcessBatch compares ProcessBatch with 100 messages per
// transaction against Process of the same number of messages one by one
// (ratio = batch / per-message), and against plain SQL batching of the
// business inserts alone, BEGIN, 100 INSERTs, COMMIT (plain-ratio = batch /
// plain batch).
func BenchmarkProcessBatch(b *testing.B) {
	pool := benchPool(b)
	ctx := context.Background()
	c, err := consumer.New(pool, "bench", insertOrder, consumer.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	n := max(b.N, 100) / 100 * 100
	b.ResetTimer()
	perMessage := rate(b, benchMessages(n), 1, func(m *consumer.Message) error {
		_ = c.Process(ctx, m)
		return nil
	})
	msgs := benchMessages(n)
	start := time.Now()
	for i := 0; i < n; i += 100 {
		for _, r := range c.ProcessBatch(ctx, msgs[i:i+100]) {
			if r.Outcome != consumer.Applied {
				b.Fatalf("%v: %v", r.Outcome, r.Err)
			}
		}
	}
	batch := float64(n) / time.Since(start).Seconds()

	msgs = benchMessages(n)
	start = time.Now()
	for i := 0; i < n; i += 100 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, m := range msgs[i : i+100] {
				if err := insertOrder(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	plain := float64(n) / time.Since(start).Seconds()
	b.ReportMetric(perMessage, "per-message-msg/s")
	b.ReportMetric(batch, "batch-msg/s")
	b.ReportMetric(plain, "plain-batch-msg/s")
	b.ReportMetric(batch/perMessage, "ratio")
	b.ReportMetric(batch/plain, "plain-ratio")
}
