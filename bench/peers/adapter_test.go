package peers_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemwatermill"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// adapterOutbox is idemq's Watermill adapter: Watermill messages published
// with idemwatermill's Publisher on the business transaction into an
// outbox table of its own, and a Subscriber whose relay hands them to a
// subscription that acks each one and counts it.
type adapterOutbox struct {
	pool *pgxpool.Pool
	ob   *outbox.Outbox
}

func newAdapter(b *testing.B, pool *pgxpool.Pool) *adapterOutbox {
	ob, err := outbox.New(pool, outbox.Config{Table: "adapter_outbox"})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return &adapterOutbox{pool: pool, ob: ob}
}

// byKeyMetadata orders the messages by their "key" metadata, as the
// Watermill peer's messages carry it; none means unordered.
var byKeyMetadata = idemwatermill.PublisherConfig{Key: func(_ string, m *message.Message) string { return m.Metadata.Get("key") }}

func (p *adapterOutbox) publishTx(ctx context.Context, i int) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders_adapter (id) VALUES ($1)`, i); err != nil {
			return err
		}
		pub, err := idemwatermill.NewPublisher(tx, p.ob, byKeyMetadata)
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set("key", fmt.Sprint("customer-", i%1000))
		return pub.Publish("orders", msg)
	})
}

// fill writes 10,000 messages per Publish call, each call one transaction.
func (p *adapterOutbox) fill(ctx context.Context, n, keys int) error {
	pub, err := idemwatermill.NewPublisher(p.pool, p.ob, byKeyMetadata)
	if err != nil {
		return err
	}
	for from := 0; from < n; from += 10_000 {
		msgs := make([]*message.Message, min(10_000, n-from))
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
			if keys > 0 {
				msgs[i].Metadata.Set("key", fmt.Sprint("customer-", (from+i)%keys))
			}
		}
		if err := pub.Publish("orders", msgs...); err != nil {
			return err
		}
	}
	return nil
}

func (p *adapterOutbox) start(ctx context.Context, delivered func(int)) (func(), error) {
	sub, err := idemwatermill.NewSubscriber(p.pool, p.ob, idemwatermill.SubscriberConfig{Relay: relay.Config{Logger: quiet}})
	if err != nil {
		return nil, err
	}
	msgs, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for msg := range msgs {
			msg.Ack()
			delivered(1)
		}
	})
	return func() {
		_ = sub.Close()
		wg.Wait()
	}, nil
}
