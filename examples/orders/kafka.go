package main

import (
	"context"
	"errors"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

// kafkaLeg runs an in-process Kafka broker (kfake; IDEMQ_TEST_KAFKA_BROKERS
// points it at real brokers) with a 3-partition "orders" topic.
type kafkaLeg struct {
	k      *testenv.KafkaCluster
	writer *kafka.Writer
	sink   *idemqkafka.Sink
}

func newKafkaLeg(ctx context.Context) (leg, error) {
	k, err := testenv.StartKafka(ctx, 3, "orders")
	if err != nil {
		return nil, err
	}
	w := idemqkafka.NewWriter(k.Brokers...)
	w.Transport = &kafka.Transport{}
	sink, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		_ = k.Close()
		return nil, err
	}
	return &kafkaLeg{k: k, writer: w, sink: sink}, nil
}

func (l *kafkaLeg) Name() string        { return "kafka" }
func (l *kafkaLeg) Destination() string { return l.k.Topic("orders") }
func (l *kafkaLeg) Sink() relay.Sink    { return l.sink }

var errCrash = errors.New("demo: consumer killed between commit and offset commit")

func (l *kafkaLeg) Subscribe(ctx context.Context, c *consumer.Consumer, crash func(*consumer.Message, consumer.Result) bool) (subscription, error) {
	cfg := idemqkafka.SubscriberConfig{
		Brokers: l.k.Brokers,
		GroupID: l.k.Group("shipping"),
		Topics:  []string{l.k.Topic("orders")},
		Batch:   true,
	}
	if crash != nil {
		cfg.BeforeCommit = func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) error {
			for i := range msgs {
				if crash(msgs[i], results[i]) {
					return errCrash
				}
			}
			return nil
		}
	}
	s, err := idemqkafka.NewSubscriber(c, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := &runningSubscriber{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(sub.done)
		sub.err = s.Run(ctx)
	}()
	return sub, nil
}

func (l *kafkaLeg) Close() error {
	err := l.writer.Close()
	l.writer.Transport.(*kafka.Transport).CloseIdleConnections()
	return errors.Join(err, l.k.Close())
}

// runningSubscriber is a Subscriber.Run in a goroutine.
type runningSubscriber struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func (s *runningSubscriber) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

func (s *runningSubscriber) Done() <-chan struct{} { return s.done }
