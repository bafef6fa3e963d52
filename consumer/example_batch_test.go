package consumer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
)

// A batch handler writes a whole fetch in one statement; a redelivered
// message never reaches it.
func ExampleNewBatched() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example_batched")
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id text, amount text)`); err != nil {
		log.Fatal(err)
	}

	c, err := consumer.NewBatched(pool, "payments", func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		ids, amounts := make([]string, len(msgs)), make([]string, len(msgs))
		for i, msg := range msgs {
			ids[i], amounts[i] = msg.ID, string(msg.Payload)
		}
		fmt.Println("handler gets", ids)
		_, err := tx.Exec(ctx, `INSERT INTO payments SELECT * FROM unnest($1::text[], $2::text[])`, ids, amounts)
		return err
	}, consumer.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	c.Process(ctx, &consumer.Message{ID: "pay-1", Payload: []byte("10.00")})
	var batch []*consumer.Message
	for _, id := range []string{"pay-1", "pay-2", "pay-3"} {
		batch = append(batch, &consumer.Message{ID: id, Payload: []byte("10.00")})
	}
	for _, r := range c.ProcessBatch(ctx, batch) {
		fmt.Println(r.Key, r.Outcome)
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&rows)
	fmt.Println("payments:", rows)
	// Output:
	// handler gets [pay-1]
	// handler gets [pay-2 pay-3]
	// pay-1 duplicate
	// pay-2 applied
	// pay-3 applied
	// payments: 3
}
