package nats_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// The JetStream Sink publishes outbox messages (one of them twice, as
// after a relay crash between publish and delete: the stream's duplicate
// window drops it), and a JetStreamSubscriber applies each once.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	n, err := testenv.StartNATS(ctx) // or nats.Connect to your server
	if err != nil {
		panic(err)
	}
	defer n.Close()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example") // or your pgxpool.Pool
	if err != nil {
		panic(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id text NOT NULL)`); err != nil {
		panic(err)
	}

	nc, err := n.Connect()
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		panic(err)
	}
	stream, err := n.CreateStream(ctx, js, jetstream.StreamConfig{Name: n.Name("ORDERS"), Subjects: []string{n.Name("orders")}})
	if err != nil {
		panic(err)
	}

	// Outbound: the relay hands batches of outbox rows to the Sink.
	sink, err := idemqnats.NewJetStreamSink(js, idemqnats.SinkConfig{})
	if err != nil {
		panic(err)
	}
	var batch []relay.Message
	for _, order := range []string{"o-1", "o-2", "o-3"} {
		batch = append(batch, relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: n.Name("orders"), Key: order, Payload: []byte(order)}})
	}
	if err := sink.Publish(ctx, 0, batch); err != nil {
		panic(err)
	}
	if err := sink.Publish(ctx, 0, batch[:1]); err != nil { // the relay's re-publish
		panic(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("messages in the stream:", info.State.Msgs)

	// Inbound: the handler's writes commit with the inbox record; the ack
	// follows the commit.
	var applied atomic.Int32
	all := make(chan struct{})
	c, err := consumer.New(pool, "shipping", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, msg.Payload)
		return err
	}, consumer.Config{Redeliver: true, Hooks: consumer.Hooks{OnResult: func(r consumer.ResultEvent) {
		if r.Outcome == consumer.Applied && applied.Add(1) == 3 {
			close(all)
		}
	}}})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil {
		panic(err)
	}
	durable, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "shipping", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		panic(err)
	}
	sub, err := idemqnats.NewJetStreamSubscriber(c, durable, js, idemqnats.JetStreamSubscriberConfig{
		Batch:  true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	running, err := idemq.Start(ctx, sub) // returns once it fetches
	if err != nil {
		panic(err)
	}
	<-all
	if err := running.Stop(); err != nil { // graceful: finish what was fetched, ack it
		panic(err)
	}

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Printf("applied %d, shipments %d\n", applied.Load(), rows)
	// Output:
	// messages in the stream: 3
	// applied 3, shipments 3
}
