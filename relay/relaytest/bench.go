package relaytest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// OutboxMessages returns n order messages to destination over 64 ordering
// keys, for the outbound benchmarks every transport runs.
func OutboxMessages(n int, destination string) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: destination, Key: fmt.Sprint("c-", i%64),
			Payload: fmt.Appendf(nil, `{"order":%d,"amount":"10.00"}`, i)}
	}
	return msgs
}

// RelayThroughput enqueues msgs in the outbox on pool, then runs a relay
// (two workers, batches of batchSize) that publishes them through sink, and
// returns the messages per second from its start until the last one was
// published: the whole outbound path a transport's Sink sits on.
func RelayThroughput(tb testing.TB, pool *pgxpool.Pool, sink relay.Sink, msgs []outbox.Message, batchSize int) float64 {
	tb.Helper()
	ctx := context.Background()
	ob, err := outbox.New(pool, outbox.Config{DisableNotify: true})
	if err != nil {
		tb.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := ob.Enqueue(ctx, msgs...); err != nil {
		tb.Fatal(err)
	}
	var published atomic.Int64
	var once sync.Once
	all := make(chan struct{})
	r, err := relay.New(pool, ob, sink, relay.Config{BatchSize: batchSize, Workers: 2, DisableListen: true,
		PollInterval: time.Millisecond, Hooks: relay.Hooks{OnPublished: func(e relay.PublishedEvent) {
			if published.Add(int64(len(e.Messages))) >= int64(len(msgs)) {
				once.Do(func() { close(all) })
			}
		}}})
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	running, err := idemq.Start(ctx, r)
	if err != nil {
		tb.Fatal(err)
	}
	<-all
	rate := float64(len(msgs)) / time.Since(start).Seconds()
	if err := running.Stop(); err != nil {
		tb.Fatal(err)
	}
	return rate
}
