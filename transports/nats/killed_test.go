package nats_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
	"github.com/idemq/idemq/transports/transporttest"
)

// Real subscriber processes with consumer.Config.Redeliver, SIGKILLed
// inside the handler (three times: JetStream counts each as a delivery)
// and between the database commit and the ack (twice), then a survivor:
// every message is applied exactly once and none is dead-lettered,
// although the first one was delivered six times to a consumer allowing
// two attempts.
func TestJetStreamSubscriberKilledProcesses(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			url := testenv.PostgresURL(t)
			pool, err := pgxpool.New(w.ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			transporttest.CreateEffects(t, pool)
			var ids []string
			for i := range 5 {
				ids = append(ids, fmt.Sprint("order-", i))
			}
			w.publish(ids...)
			w.durable("killed", jetstream.ConsumerConfig{AckWait: time.Second})
			spec := transporttest.ChildSpec{DatabaseURL: url, Batch: batch, Redeliver: true, Params: map[string]string{
				"url": w.e.n.URL, "stream": w.e.n.Name("ORDERS"), "durable": "killed",
			}}
			transporttest.KillChildren(t, "TestJetStreamSubscriberKilledChild", spec, transporttest.KillInHandler,
				transporttest.KillInHandler, transporttest.KillInHandler, transporttest.KillBeforeAck, transporttest.KillBeforeAck)

			transporttest.Survive(t, pool, spec, ids, func(c *consumer.Consumer) (idemq.Service, error) {
				return killedSubscriber(w.ctx, w.e.nc, c, spec)
			})
		})
	}
}

// TestJetStreamSubscriberKilledChild is the subscriber process of
// TestJetStreamSubscriberKilledProcesses; it runs only as its child.
func TestJetStreamSubscriberKilledChild(t *testing.T) {
	// Not parallel: the child process of TestJetStreamSubscriberKilledProcesses; it runs alone in its own process.
	spec, ok := transporttest.Child()
	if !ok {
		t.Skip("the child process of TestJetStreamSubscriberKilledProcesses")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, spec.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(spec.Params["url"])
	if err != nil {
		t.Fatal(err)
	}
	s, err := killedSubscriber(ctx, nc, transporttest.ChildConsumer(t, pool, spec, consumer.Hooks{}), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("Run returned before the kill: %v", s.Run(ctx))
}

// killedSubscriber binds to the durable of spec.
func killedSubscriber(ctx context.Context, nc *nats.Conn, c *consumer.Consumer, spec transporttest.ChildSpec) (*idemqnats.JetStreamSubscriber, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.Consumer(ctx, spec.Params["stream"], spec.Params["durable"])
	if err != nil {
		return nil, err
	}
	return idemqnats.NewJetStreamSubscriber(c, cons, js, idemqnats.JetStreamSubscriberConfig{
		Batch: spec.Batch, FetchWait: 200 * time.Millisecond, Test: idemqnats.TestConfig{BeforeAck: spec.BeforeAck()},
	})
}
