package endpoints_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// Example registers an endpoint and fans an event out to it in a business
// transaction: the outbox row exists once the transaction commits, and a
// relay with a webhook.Sink delivers it.
func Example() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "endpoints_example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	ob, _ := outbox.New(pool, outbox.Config{})
	reg, _ := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})
	for _, m := range []func(context.Context) error{ob.Migrate, reg.Migrate} { // or idemq migrate
		if err := m(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}
	ep, err := reg.Add(ctx, endpoints.Endpoint{
		ID:         "partner",
		URL:        "https://partner.example/hooks",
		EventTypes: []string{"invoice.paid"},
		Keys:       []string{signing.NewSecret()}, // hand it to the partner
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	pub, _ := endpoints.NewPublisher(reg, ob)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business writes ...
		n, err := pub.PublishTx(ctx, tx, endpoints.Event{Type: "invoice.paid", Key: "inv_1", Data: json.RawMessage(`{"amount":42}`)})
		fmt.Println("deliveries:", n)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var dest, key string
	if err := pool.QueryRow(ctx, `SELECT destination, key FROM idemq_outbox`).Scan(&dest, &key); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ep.Enabled(), dest, key)
	// Output:
	// deliveries: 1
	// true webhook/partner partner/inv_1
}
