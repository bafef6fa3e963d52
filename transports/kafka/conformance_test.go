package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/idemq/idemq/transports/transporttest"
	"github.com/segmentio/kafka-go"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	transporttest.Run(t, func(t *testing.T) transporttest.Harness { return newHarness(t) })
}

// harness runs the conformance suite on a 3-partition topic.
type harness struct {
	t *testing.T
	k *testenv.KafkaCluster
}

func newHarness(t *testing.T) *harness {
	return &harness{t: t, k: testenv.Kafka(t, 3, "orders", "orders.dlq")}
}

func (h *harness) Features() transporttest.Features {
	return transporttest.Features{Redelivery: true, SharedGroup: true, Batch: true, DeadLetterDestination: true, OrderedPerKey: true}
}

func (h *harness) Publish(ctx context.Context, msgs ...transporttest.Message) error {
	out := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		out[i] = kafka.Message{Topic: h.k.Topic("orders"), Value: m.Payload}
		if m.Key != "" {
			out[i].Key = []byte(m.Key)
		}
		if m.ID != "" {
			out[i].Headers = []kafka.Header{{Key: idemqkafka.IDHeaderDefault, Value: []byte(m.ID)}}
		}
	}
	return h.k.Produce(ctx, out...)
}

func (h *harness) Sink() (relay.Sink, string) {
	return newSink(h.t, h.k), h.k.Topic("orders")
}

func (h *harness) DeadLetters(ctx context.Context) ([]string, error) {
	msgs, err := h.k.ReadAll(ctx, h.k.Topic("orders.dlq"))
	var ids []string
	for _, m := range msgs {
		if id, ok := header(m, idemqkafka.IDHeaderDefault); ok {
			ids = append(ids, id)
		}
	}
	return ids, err
}

func (h *harness) Subscriber(c *consumer.Consumer, opts transporttest.SubscribeOptions) idemq.Service {
	cfg := subscriberConfig(h.k, h.k.Group(opts.Group))
	cfg.Batch = opts.Batch
	cfg.DeadLetterTopic = h.k.Topic("orders.dlq")
	cfg.Test.BeforeCommit = opts.BeforeAck()
	cfg.Logger = opts.Logger
	s, err := idemqkafka.NewSubscriber(c, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func subscriberConfig(k *testenv.KafkaCluster, group string) idemqkafka.SubscriberConfig {
	return idemqkafka.SubscriberConfig{
		Brokers:           k.Brokers,
		GroupID:           group,
		Topics:            []string{k.Topic("orders")},
		HeartbeatInterval: 250 * time.Millisecond,
		SessionTimeout:    6 * time.Second, // kfake's minimum
		RebalanceTimeout:  6 * time.Second,
		MaxWait:           250 * time.Millisecond,
	}
}
