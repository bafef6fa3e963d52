package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"net/netip"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// Example sends an event to a receiver built with the middleware, through
// the registry, the outbox and a relay.
func Example() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "webhook_example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	ob, _ := outbox.New(pool, outbox.Config{})
	reg, _ := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})

	// The receiving side: a consumer whose handler runs in the transaction
	// that records the webhook-id in its inbox, behind a verifying Receiver.
	applied := make(chan string, 1)
	c, _ := consumer.New(pool, "partner", webhook.Handle(func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		var p struct{ Type string }
		if err := json.Unmarshal(d.Body, &p); err != nil {
			return idemq.Permanent(err)
		}
		applied <- p.Type
		return nil
	}), consumer.Config{Redeliver: true}) // the sender spaces the retries
	for _, m := range []func(context.Context) error{ob.Migrate, reg.Migrate, c.Migrate} {
		if err := m(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}
	secret := signing.NewSecret()
	recv, _ := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{secret}})
	srv := httptest.NewServer(recv)
	defer srv.Close()

	// The sending side: an endpoint, a Sink behind a relay, and an event
	// published in a business transaction.
	if _, err := reg.Add(ctx, endpoints.Endpoint{URL: srv.URL, Keys: []string{secret}, EventTypes: []string{"invoice.paid"}}); err != nil {
		fmt.Println(err)
		return
	}
	sink, _ := webhook.NewSink(reg, webhook.Config{
		// Only because this receiver runs on loopback: the SSRF guard
		// refuses it by default.
		AllowedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	})
	router := relay.NewRouter()
	_ = router.RoutePrefix(endpoints.DestinationPrefix, sink)
	r, _ := relay.New(pool, ob, router, relay.Config{})
	running, err := idemq.Start(ctx, r)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer running.Stop()

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
	fmt.Println("applied:", <-applied)
	// Output:
	// deliveries: 1
	// applied: invoice.paid
}
