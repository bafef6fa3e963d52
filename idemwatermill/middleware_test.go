package idemwatermill_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/idemwatermill"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// bundle is a Router on a fresh database: the outbox, a Publisher on the
// pool, the Subscriber and the Middleware.
type bundle struct {
	pool *pgxpool.Pool
	ob   *outbox.Outbox
	pub  *idemwatermill.Publisher
	sub  *idemwatermill.Subscriber
	mw   *idemwatermill.Middleware
}

func setup(t *testing.T) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{pool: testenv.Postgres(t)}
	var err error
	if b.ob, err = outbox.New(b.pool, outbox.Config{Table: "watermill_outbox"}); err != nil {
		t.Fatal(err)
	}
	if err := b.ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if b.pub, err = idemwatermill.NewPublisher(b.pool, b.ob, idemwatermill.PublisherConfig{}); err != nil {
		t.Fatal(err)
	}
	if b.sub, err = idemwatermill.NewSubscriber(b.pool, b.ob, idemwatermill.SubscriberConfig{Relay: relay.Config{Logger: quiet}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.sub.Close(); err != nil {
			t.Error(err)
		}
	})
	if b.mw, err = idemwatermill.NewMiddleware(b.pool, "orders", consumer.Config{Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	if err := b.mw.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// run runs a Router with handler on the "orders" topic behind the
// Middleware and a middleware counting deliveries, until the test ends.
func (b *bundle) run(t *testing.T, handler message.NoPublishHandlerFunc) (deliveries *atomic.Int64) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	deliveries = &atomic.Int64{}
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			deliveries.Add(1)
			return h(msg)
		}
	}, b.mw.Wrap)
	router.AddConsumerHandler("orders", "orders", b.sub, handler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	<-router.Running()
	return deliveries
}

// TestMiddlewareAppliesEachMessageOnce: a message delivered twice (as after
// a subscriber died between its Ack and the row's delete: same UUID) and a
// message whose handler fails once are applied once each, the handler's
// writes in the inbox's transaction; a message published in a business
// transaction that rolled back is never delivered, one whose transaction
// committed is, with the business row.
func TestMiddlewareAppliesEachMessageOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	effects := idemqtest.NewEffects(t, b.pool)
	var failedOnce atomic.Bool
	deliveries := b.run(t, func(msg *message.Message) error {
		tx, ok := idemwatermill.Tx(msg.Context())
		if !ok {
			return errors.New("no transaction in the message's context")
		}
		if err := effects.Record(msg.Context(), tx, string(msg.Payload)); err != nil {
			return err
		}
		if string(msg.Payload) == "flaky" && failedOnce.CompareAndSwap(false, true) {
			return errors.New("first attempt fails, after its write")
		}
		return nil
	})

	twice := message.NewMessage(watermill.NewUUID(), []byte("twice"))
	for _, m := range []*message.Message{twice, twice.Copy(), message.NewMessage(watermill.NewUUID(), []byte("flaky"))} {
		if err := b.pub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		name := map[bool]string{false: "rolled-back", true: "committed"}[commit]
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, name); err != nil {
			t.Fatal(err)
		}
		pub, err := idemwatermill.NewPublisher(tx, b.ob, idemwatermill.PublisherConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte(name))); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	// twice, its copy, flaky and committed: four deliveries, then an empty
	// outbox.
	idemqtest.WaitFor(t, "four deliveries and an empty outbox", func() bool {
		st, err := b.ob.Stats(ctx)
		return err == nil && deliveries.Load() == 4 && st.Pending == 0
	})
	effects.AssertOnce(t, "twice", "flaky", "committed")
	var orders []string
	rows, _ := b.pool.Query(ctx, `SELECT id FROM orders`)
	orders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(orders) != 1 || orders[0] != "committed" {
		t.Fatalf("orders = %v, %v; want only the committed one", orders, err)
	}
	if !failedOnce.Load() {
		t.Fatal("the flaky handler never failed")
	}
}

// TestPublisherRefusesBadMetadata: metadata that cannot be a header (a name
// that is no HTTP token) fails Publish with outbox.ErrInvalidMessage and
// writes nothing of the call.
func TestBadInputPublisherRefusesBadMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := message.NewMessage(watermill.NewUUID(), []byte("ok"))
	bad := message.NewMessage(watermill.NewUUID(), []byte("bad"))
	bad.Metadata.Set("no spaces allowed", "x")
	if err := b.pub.Publish("orders", ok, bad); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("Publish = %v, want outbox.ErrInvalidMessage", err)
	}
	st, err := b.ob.Stats(context.Background())
	if err != nil || st.Pending != 0 {
		t.Fatalf("pending = %d, %v; want 0", st.Pending, err)
	}
	if _, err := idemwatermill.NewPublisher(nil, b.ob, idemwatermill.PublisherConfig{}); err == nil {
		t.Fatal("NewPublisher(nil db) succeeded")
	}
	if _, err := idemwatermill.NewSubscriber(b.pool, nil, idemwatermill.SubscriberConfig{}); err == nil {
		t.Fatal("NewSubscriber(nil outbox) succeeded")
	}
}
