package kafka_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/testenv/conformance"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/segmentio/kafka-go"
)

func TestConformance(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness { return newHarness(t) })
}

// harness runs the conformance suite on a 3-partition topic.
type harness struct {
	t *testing.T
	k *testenv.KafkaCluster
}

func newHarness(t *testing.T) *harness {
	return &harness{t: t, k: testenv.Kafka(t, 3, "orders", "orders.dlq")}
}

func (h *harness) Features() conformance.Features {
	return conformance.Features{Redelivery: true, SharedGroup: true, Batch: true, DeadLetterDestination: true, OrderedPerKey: true}
}

func (h *harness) Publish(ctx context.Context, msgs ...conformance.Message) error {
	out := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		out[i] = kafka.Message{Topic: h.k.Topic("orders"), Value: m.Payload}
		if m.Key != "" {
			out[i].Key = []byte(m.Key)
		}
		if m.ID != "" {
			out[i].Headers = []kafka.Header{{Key: idemqkafka.DefaultIDHeader, Value: []byte(m.ID)}}
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
		if id, ok := header(m, idemqkafka.DefaultIDHeader); ok {
			ids = append(ids, id)
		}
	}
	return ids, err
}

var errCrash = errors.New("conformance: crash")

func (h *harness) Subscribe(ctx context.Context, c *consumer.Consumer, opts conformance.SubscribeOptions) conformance.Subscription {
	cfg := subscriberConfig(h.k, h.k.Group(opts.Group))
	cfg.Batch = opts.Batch
	cfg.DeadLetterTopic = h.k.Topic("orders.dlq")
	if opts.Crash != nil {
		cfg.BeforeCommit = func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) error {
			for i := range msgs {
				if opts.Crash(msgs[i], results[i]) {
					return errCrash
				}
			}
			return nil
		}
	}
	s, err := idemqkafka.NewSubscriber(c, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return run(ctx, s)
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

// subscription runs a Subscriber in a goroutine.
type subscription struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	once   sync.Once
}

func run(ctx context.Context, s *idemqkafka.Subscriber) *subscription {
	ctx, cancel := context.WithCancel(ctx)
	sub := &subscription{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(sub.done)
		sub.err = s.Run(ctx)
	}()
	return sub
}

func (s *subscription) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

func (s *subscription) Done() <-chan struct{} { return s.done }
