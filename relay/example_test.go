package relay_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// A relay publishes what business transactions enqueued, in order per key,
// through a Router that picks a Sink per destination.
func ExampleRelay_Run() {
	ctx := context.Background()
	pool, drop, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	defer drop()

	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	delivered := make(chan struct{})
	seen := 0
	router := relay.NewRouter()
	// A stand-in for a Kafka or NATS sink from the transports packages.
	printer := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		for _, m := range batch {
			fmt.Printf("%s key=%s %s\n", m.Destination, m.Key, m.Payload)
			if seen++; seen == 3 {
				close(delivered)
			}
		}
		return nil
	})
	if err := router.RoutePrefix("orders.", printer); err != nil {
		log.Fatal(err)
	}

	r, err := relay.New(pool, ob, router, relay.Config{ShutdownGrace: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	running, err := idemq.Start(ctx, r) // returns once the relay listens
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.EnqueueTx(ctx, tx,
			outbox.Message{Destination: "orders.created", Key: "o-1", Payload: []byte(`{"total":42}`)},
			outbox.Message{Destination: "orders.paid", Key: "o-1", Payload: []byte(`{"amount":42}`)},
			outbox.Message{Destination: "orders.shipped", Key: "o-1", Payload: []byte(`{"carrier":"post"}`)},
		)
	})
	if err != nil {
		log.Fatal(err)
	}

	<-delivered
	// Graceful: Run returns once in-flight work is settled.
	if err := running.Stop(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// orders.created key=o-1 {"total":42}
	// orders.paid key=o-1 {"amount":42}
	// orders.shipped key=o-1 {"carrier":"post"}
}
