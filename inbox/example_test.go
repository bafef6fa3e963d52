package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// ClaimTx records a key inside the business transaction; a second delivery
// finds it, and a reused key with another payload is a conflict.
func ExampleStore_ClaimTx() {
	ctx := context.Background()
	pool, store, done := exampleStore(ctx)
	defer done()

	deliver := func(payload string) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			claim, err := store.ClaimTx(ctx, tx, "shipping", "order-7", []byte(payload))
			var conflict *inbox.ConflictError
			switch {
			case errors.As(err, &conflict):
				fmt.Println("conflict with the record first seen as", conflict.Stored.Status)
				return nil
			case err != nil:
				return err
			case claim.New:
				fmt.Println("new: apply the message in this transaction")
			default:
				fmt.Println("duplicate of a", claim.Existing.Status, "record")
			}
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	deliver("ship 1 box")
	deliver("ship 1 box")
	deliver("ship 9 boxes")
	// Output:
	// new: apply the message in this transaction
	// duplicate of a SUCCEEDED record
	// conflict with the record first seen as SUCCEEDED
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

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.DeadLetterTx(ctx, tx, "billing", "order-9", nil, 5, errors.New("unknown currency"))
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
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
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		claim, err := store.ClaimTx(ctx, tx, "billing", "order-9", nil)
		fmt.Println("released:", released, "next delivery is new:", claim.New)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// billing/order-9 after 5 failures: unknown currency
	// released: 1 next delivery is new: true
}
