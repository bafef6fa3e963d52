package outbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// exampleDB creates a scratch database on the test server (see testenv)
// and returns a pool on it and a function that drops it.
func exampleDB(ctx context.Context) (*pgxpool.Pool, func()) {
	admin, err := pgx.Connect(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemq_example_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		admin.Close(ctx)
	}
}

// Enqueue writes the business row and the message in one transaction: the
// message exists if and only if the order does.
func ExampleOutbox_Enqueue() {
	ctx := context.Background()
	pool, drop := exampleDB(ctx)
	defer drop()

	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, total int)`); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1', 42)`); err != nil {
			return err
		}
		return ob.Enqueue(ctx, tx, outbox.Message{
			Destination: "orders.created",
			Key:         "o-1", // messages of one order are published in order
			Payload:     []byte(`{"id":"o-1","total":42}`),
			Headers:     map[string]string{"content-type": "application/json"},
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	st, err := ob.Stats(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", st.Pending)
	// Output: pending: 1
}
