package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/testenv"
)

// exampleStore opens a fresh database on the local server with a migrated
// inbox.
func exampleStore(ctx context.Context) (*pgxpool.Pool, *inbox.Store, func()) {
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	store, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	return pool, store, done
}

// Consumers (package consumer) claim keys in the inbox inside the
// business transaction; the Store reads what they recorded.
func ExampleStore_Get() {
	ctx := context.Background()
	pool, store, done := exampleStore(ctx)
	defer done()

	ship := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error { return nil } // write in tx
	c, err := consumer.New(pool, "shipping", ship, consumer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	msg := &consumer.Message{ID: "order-7", Payload: []byte("ship 1 box")}
	fmt.Println("first delivery:", c.Process(ctx, msg).Outcome)
	fmt.Println("redelivery:", c.Process(ctx, msg).Outcome)

	rec, err := store.Get(ctx, "shipping", "order-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("record:", rec.Status)
	// Output:
	// first delivery: applied
	// redelivery: duplicate
	// record: SUCCEEDED
}

// Acquire leases a key for an effect outside Postgres; the fencing token
// goes downstream with the call, and Complete records the result.
func ExampleStore_Acquire() {
	ctx := context.Background()
	_, store, done := exampleStore(ctx)
	defer done()

	claim, err := store.Acquire(ctx, "mailer", "welcome-42", nil, "worker-1", 30*time.Second)
	if err != nil || !claim.New {
		log.Fatal(claim, err)
	}
	// The token is the database clock in microseconds or above: pass it
	// downstream, which keeps the highest it has seen.
	fmt.Println("send the email with idempotency key", claim.Lease.Key, "and a fencing token:", claim.Lease.Token > 0)
	if err := store.Complete(ctx, claim.Lease, []byte("queued as 250 OK")); err != nil {
		log.Fatal(err)
	}

	again, err := store.Acquire(ctx, "mailer", "welcome-42", nil, "worker-2", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("redelivery: new=%v, stored result %q\n", again.New, again.Existing.Result)
	// Output:
	// send the email with idempotency key welcome-42 and a fencing token: true
	// redelivery: new=false, stored result "queued as 250 OK"
}

// A message that failed for good is a dead letter: list it, and once the
// cause is fixed release it, so that its next delivery is applied.
func ExampleStore_DeadLetters() {
	ctx := context.Background()
	pool, store, done := exampleStore(ctx)
	defer done()

	// A handler that rejects the message for good: it becomes a dead letter.
	fixed := false
	bill := func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if !fixed {
			return idemq.Permanent(errors.New("unknown currency"))
		}
		return nil
	}
	c, err := consumer.New(pool, "billing", bill, consumer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	msg := &consumer.Message{ID: "order-9", Payload: []byte("42 XYZ")}
	c.Process(ctx, msg)
	dead, err := store.DeadLetters(ctx, inbox.DeadFilter{Scope: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dead {
		fmt.Printf("%s/%s after %d failures: %s\n", d.Scope, d.Key, d.Failures, d.LastError)
	}

	released, err := store.Release(ctx, inbox.DeadFilter{Scope: "billing", Key: "order-9"})
	if err != nil {
		log.Fatal(err)
	}
	fixed = true
	fmt.Println("released:", released, "next delivery:", c.Process(ctx, msg).Outcome)
	// Output:
	// billing/order-9 after 1 failures: permanent: unknown currency
	// released: 1 next delivery: applied
}
