package consumer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
)

// A payment message delivered three times (the broker redelivered it) and a
// second message are applied once each.
func Example() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id text, amount text)`); err != nil {
		log.Fatal(err)
	}

	c, err := consumer.New(pool, "payments", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2)`, msg.ID, string(msg.Payload))
		return err
	}, consumer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	for _, id := range []string{"pay-1", "pay-1", "pay-2", "pay-1"} {
		r := c.Process(ctx, &consumer.Message{ID: id, Payload: []byte("10.00")})
		fmt.Println(id, r.Outcome, "ack:", r.Settled())
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&rows)
	fmt.Println("payments:", rows)
	// Output:
	// pay-1 applied ack: true
	// pay-1 duplicate ack: true
	// pay-2 applied ack: true
	// pay-1 duplicate ack: true
	// payments: 2
}
