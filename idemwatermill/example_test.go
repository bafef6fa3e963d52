package idemwatermill_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemwatermill"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// A Watermill Router handler made effectively once: the Middleware runs it
// in the transaction that records the message in the inbox, so a message
// delivered twice (here published twice with one UUID, as a redelivery
// after a crash would be) charges the card once.
func Example() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (order_id text, amount text)`); err != nil {
		log.Fatal(err)
	}

	ob, err := outbox.New(pool, outbox.Config{Table: "watermill_outbox"})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemwatermill.NewMiddleware(pool, "charges", consumer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := errors.Join(ob.Migrate(ctx), mw.Migrate(ctx)); err != nil {
		log.Fatal(err)
	}
	pub, err := idemwatermill.NewPublisher(pool, ob, idemwatermill.PublisherConfig{})
	if err != nil {
		log.Fatal(err)
	}
	sub, err := idemwatermill.NewSubscriber(pool, ob, idemwatermill.SubscriberConfig{Relay: relay.Config{Logger: quiet}})
	if err != nil {
		log.Fatal(err)
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(mw.Wrap)
	router.AddConsumerHandler("charge", "orders", sub, func(msg *message.Message) error {
		tx, _ := idemwatermill.Tx(msg.Context())
		_, err := tx.Exec(msg.Context(), `INSERT INTO charges VALUES ($1, $2)`, msg.Metadata.Get("order"), string(msg.Payload))
		return err
	})
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = router.Run(ctx) }()

	first := message.NewMessage(watermill.NewUUID(), []byte("10.00"))
	first.Metadata.Set("order", "o-1")
	second := message.NewMessage(watermill.NewUUID(), []byte("25.00"))
	second.Metadata.Set("order", "o-2")
	if err := pub.Publish("orders", first, first.Copy(), second); err != nil {
		log.Fatal(err)
	}

	// The handler runs for o-1, the copy of o-1 is acked unseen, then o-2
	// (one topic is delivered in order).
	var charges map[string]int
	for deadline := time.Now().Add(time.Minute); len(charges) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("no charge of o-2 within a minute")
		}
		rows, _ := pool.Query(ctx, `SELECT order_id, count(*)::int FROM charges GROUP BY 1`)
		charges = map[string]int{}
		var order string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&order, &n}, func() error { charges[order] = n; return nil }); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("charges:", charges)
	stop()
	_ = router.Close()
	// Output:
	// charges: map[o-1:1 o-2:1]
}

// A Publisher on the business transaction: the message is in the outbox if
// and only if the order is.
func ExampleNewPublisher() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	ob, err := outbox.New(pool, outbox.Config{Table: "watermill_outbox"})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	place := func(id string, commit bool) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, id); err != nil {
			return err
		}
		pub, err := idemwatermill.NewPublisher(tx, ob, idemwatermill.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(id))); err != nil {
			return err
		}
		if !commit {
			return nil // rolled back: no order, no message
		}
		return tx.Commit(ctx)
	}
	if err := errors.Join(place("o-1", true), place("o-2", false)); err != nil {
		log.Fatal(err)
	}
	st, err := ob.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("messages waiting:", st.Pending)
	// Output:
	// messages waiting: 1
}
