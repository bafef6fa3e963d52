package kafka_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

// A relay Sink publishes outbox messages (here one is published twice, as
// after a relay crash between publish and delete) and a Subscriber applies
// each once.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	k, err := testenv.StartKafka(ctx, 2, "orders") // or your brokers
	if err != nil {
		panic(err)
	}
	defer k.Close()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example") // or your pgxpool.Pool
	if err != nil {
		panic(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text NOT NULL)`); err != nil {
		panic(err)
	}

	// Outbound: the relay hands batches of outbox rows to the Sink.
	w := idemqkafka.NewWriter(k.Brokers...)
	defer w.Close()
	sink, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		panic(err)
	}
	var batch []relay.Message
	for _, order := range []string{"o-1", "o-2", "o-3"} {
		batch = append(batch, relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: k.Topic("orders"), Key: order, Payload: []byte(order)}})
	}
	if err := sink.Publish(ctx, 0, batch); err != nil {
		panic(err)
	}
	if err := sink.Publish(ctx, 0, batch[:1]); err != nil { // the duplicate
		panic(err)
	}

	// Inbound: the handler's writes commit with the inbox record.
	var applied, duplicates, settled atomic.Int32
	all := make(chan struct{})
	c, err := consumer.New(pool, "shipping", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, msg.Payload)
		return err
	}, consumer.Config{Hooks: consumer.Hooks{OnResult: func(r consumer.ResultEvent) {
		switch r.Outcome {
		case consumer.Applied:
			applied.Add(1)
		case consumer.Duplicate:
			duplicates.Add(1)
		}
		if settled.Add(1) == 4 {
			close(all)
		}
	}}})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil {
		panic(err)
	}
	sub, err := idemqkafka.NewSubscriber(c, idemqkafka.SubscriberConfig{
		Brokers: k.Brokers,
		GroupID: k.Group("shipping"),
		Topics:  []string{k.Topic("orders")},
		Batch:   true,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	running, err := idemq.Start(ctx, sub) // returns once it joined the group
	if err != nil {
		panic(err)
	}
	<-all
	if err := running.Stop(); err != nil { // graceful: finish, commit, leave the group
		panic(err)
	}

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Printf("applied %d, duplicates dropped %d, shipments %d\n", applied.Load(), duplicates.Load(), rows)
	// Output: applied 3, duplicates dropped 1, shipments 3
}
