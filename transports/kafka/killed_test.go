package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/idemq/idemq/transports/transporttest"
)

// Real subscriber processes, SIGKILLed inside the handler (twice) and
// between the database commit and the offset commit (twice), then a
// survivor: every message is applied exactly once and none is
// dead-lettered.
func TestSubscriberKilledProcesses(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			t.Parallel()
			k := testenv.Kafka(t, 1, "orders")
			url := testenv.PostgresURL(t)
			pool, err := pgxpool.New(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			transporttest.CreateEffects(t, pool)
			var ids []string
			var records []kafka.Message
			for i := range 5 {
				id := fmt.Sprint("order-", i)
				ids = append(ids, id)
				records = append(records, kafka.Message{Topic: k.Topic("orders"), Key: []byte("one-partition"),
					Value: []byte(id), Headers: idHeader(id)})
			}
			if err := k.Produce(context.Background(), records...); err != nil {
				t.Fatal(err)
			}
			spec := transporttest.ChildSpec{DatabaseURL: url, Batch: batch, Params: map[string]string{
				"brokers": strings.Join(k.Brokers, ","), "topic": k.Topic("orders"), "group": k.Group("g"),
			}}
			transporttest.KillChildren(t, "TestSubscriberKilledChild", spec,
				transporttest.KillInHandler, transporttest.KillInHandler, transporttest.KillBeforeAck, transporttest.KillBeforeAck)

			transporttest.Survive(t, pool, spec, ids, func(c *consumer.Consumer) (idemq.Service, error) {
				return idemqkafka.NewSubscriber(c, killedConfig(spec))
			})
		})
	}
}

// TestSubscriberKilledChild is the subscriber process of
// TestSubscriberKilledProcesses; it runs only as its child.
func TestSubscriberKilledChild(t *testing.T) {
	// Not parallel: the child process of TestSubscriberKilledProcesses; it runs alone in its own process.
	spec, ok := transporttest.Child()
	if !ok {
		t.Skip("the child process of TestSubscriberKilledProcesses")
	}
	pool, err := pgxpool.New(context.Background(), spec.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := killedConfig(spec)
	cfg.Test.BeforeCommit = spec.BeforeAck()
	s, err := idemqkafka.NewSubscriber(transporttest.ChildConsumer(t, pool, spec, consumer.Hooks{}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("Run returned before the kill: %v", s.Run(context.Background()))
}

func killedConfig(spec transporttest.ChildSpec) idemqkafka.SubscriberConfig {
	return idemqkafka.SubscriberConfig{
		Brokers:           strings.Split(spec.Params["brokers"], ","),
		GroupID:           spec.Params["group"],
		Topics:            []string{spec.Params["topic"]},
		Batch:             spec.Batch,
		HeartbeatInterval: 250 * time.Millisecond,
		SessionTimeout:    6 * time.Second, // kfake's minimum
		RebalanceTimeout:  6 * time.Second,
		MaxWait:           250 * time.Millisecond,
	}
}
