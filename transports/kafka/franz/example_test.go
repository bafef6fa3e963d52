package franz_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// A relay publishes keyed outbox messages through the transactional
// TxSink; a read_committed consumer sees each exactly once.
func ExampleNewTxSink() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := testenv.StartKafka(ctx, 2, "orders") // or your brokers
	if err != nil {
		panic(err)
	}
	defer k.Close()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example_franz") // or your pgxpool.Pool
	if err != nil {
		panic(err)
	}
	defer done()
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		panic(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		panic(err)
	}
	for _, order := range []string{"o-1", "o-2", "o-3"} {
		if err := ob.Enqueue(ctx, outbox.Message{Destination: k.Topic("orders"), Key: order, Payload: []byte(order)}); err != nil {
			panic(err)
		}
	}

	// One transactional id per outbox partition: "billing-outbox-0" to
	// "billing-outbox-63"; the watermark topic is created when missing.
	// The watermarks name the outbox, and another outbox's are refused.
	name, err := relay.OutboxName(ctx, pool, ob)
	if err != nil {
		panic(err)
	}
	sink, err := franz.NewTxSink(franz.TxConfig{
		Outbox:                name,
		TransactionalIDPrefix: "billing-outbox-",
		WatermarkTopic:        "billing-outbox-watermarks",
	}, kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		panic(err)
	}
	defer sink.Close()
	r, err := relay.New(pool, ob, sink, relay.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	running, err := idemq.Start(ctx, r)
	if err != nil {
		panic(err)
	}
	defer running.Stop()

	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumeTopics(k.Topic("orders")),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	seen := map[string]int{}
	for len(seen) < 3 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { seen[string(r.Value)]++ })
	}
	fmt.Println(seen)
	// Output: map[o-1:1 o-2:1 o-3:1]
}

// A Subscriber applies what a TxSink committed, through the consumer
// inbox, reading committed data only (not run: it needs your Postgres and
// brokers).
func ExampleNewSubscriber() {
	ctx := context.Background()
	var pool *pgxpool.Pool // your pool
	c, err := consumer.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, msg.Payload)
		return err
	}, consumer.Config{})
	if err != nil {
		panic(err)
	}
	sub, err := franz.NewSubscriber(c, franz.SubscriberConfig{
		GroupID:       "billing",
		Topics:        []string{"orders"},
		ReadCommitted: true,
		Batch:         true,
	}, kgo.SeedBrokers("kafka:9092"))
	if err != nil {
		panic(err)
	}
	running, err := idemq.Start(ctx, sub) // returns once the group is joined
	if err != nil {
		panic(err)
	}
	defer running.Stop()
}
