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

// benchConsumer returns a pool on a fresh database with room for 16
// workers, and a migrated consumer on it that inserts orders.
func benchConsumer(b *testing.B) (*pgxpool.Pool, *consumer.Consumer) {
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
	c, err := consumer.New(pool, "bench", insertOrder, consumer.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return pool, c
}

func benchMessages(n int) []*consumer.Message {
	msgs := make([]*consumer.Message, n)
	for i := range msgs {
		msgs[i] = &consumer.Message{ID: uuid.Must(uuid.NewV7()).String(), Payload: []byte(`{"order":42,"amount":"10.00"}`)}
	}
	return msgs
}

// elapsed runs apply over msgs from workers goroutines and returns the
// time it took.
func elapsed(b *testing.B, msgs []*consumer.Message, workers int, apply func(*consumer.Message) error) time.Duration {
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
	return time.Since(start)
}

// compare runs n messages through each variant, alternating between them
// in rounds so that load changes on a shared machine hit both alike, and
// reports each one's messages/s under its name and the ratio of the last
// to the first. It returns the rates.
func compare(b *testing.B, n int, variants []string, run func(variant int, msgs []*consumer.Message) time.Duration) []float64 {
	const rounds = 10
	spent := make([]time.Duration, len(variants))
	per := max(n/rounds, 1)
	b.ResetTimer()
	for range rounds {
		for v := range variants {
			spent[v] += run(v, benchMessages(per))
		}
	}
	b.StopTimer()
	rates := make([]float64, len(variants))
	for v, name := range variants {
		rates[v] = float64(per*rounds) / spent[v].Seconds()
		b.ReportMetric(rates[v], name+"-msg/s")
	}
	b.ReportMetric(rates[len(rates)-1]/rates[0], "ratio")
	return rates
}

// BenchmarkProcess compares one transaction per message through the inbox
// with the same handler and business insert without it (BEGIN, INSERT,
// COMMIT), measured in the same run; ratio = inbox / baseline.
func BenchmarkProcess(b *testing.B) {
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			pool, c := benchConsumer(b)
			ctx := context.Background()
			baseline := func(m *consumer.Message) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return insertOrder(ctx, tx, m) })
			}
			inbox := func(m *consumer.Message) error {
				if r := c.Process(ctx, m); r.Outcome != consumer.Applied {
					return fmt.Errorf("%v: %v", r.Outcome, r.Err)
				}
				return nil
			}
			compare(b, max(b.N, 200), []string{"baseline", "inbox"}, func(v int, msgs []*consumer.Message) time.Duration {
				return elapsed(b, msgs, workers, []func(*consumer.Message) error{baseline, inbox}[v])
			})
		})
	}
}
