package outbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// EnqueueTx writes the business row and the message in one transaction: the
// message exists if and only if the order does.
func ExampleOutbox_EnqueueTx() {
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
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total int)`); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1', 42)`); err != nil {
			return err
		}
		return ob.EnqueueTx(ctx, tx, outbox.Message{
			Destination: "orders.created",
			Key:         "o-1", // messages of one order are published in order
			Payload:     []byte(`{"id":"o-1","total":42}`),
			Headers:     map[string]string{"content-type": "application/json"},
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	st, err := ob.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", st.Pending)
	// Output: pending: 1
}
