package main

import (
	"context"
	"errors"

	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

// kafkaLeg runs an in-process Kafka broker (kfake; IDEMQ_TEST_KAFKA_BROKERS
// points it at real brokers) with a 3-partition "orders" topic, consumed by
// the billing service.
type kafkaLeg struct {
	k         *testenv.KafkaCluster
	sink      relay.Sink
	closeSink func() error
}

func newKafkaLeg(ctx context.Context) (leg, error) {
	k, err := testenv.StartKafka(ctx, 3, "orders")
	if err != nil {
		return nil, err
	}
	sink, closeSink, err := openKafkaSink(k.Brokers)
	if err != nil {
		return nil, errors.Join(err, k.Close())
	}
	return &kafkaLeg{k: k, sink: sink, closeSink: closeSink}, nil
}

// openKafkaSink returns a relay sink writing to brokers.
func openKafkaSink(brokers []string) (relay.Sink, func() error, error) {
	w := idemqkafka.NewWriter(brokers...)
	transport := &kafka.Transport{}
	w.Transport = transport
	sink, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	closeSink := func() error {
		err := w.Close()
		transport.CloseIdleConnections()
		return err
	}
	if err != nil {
		return nil, nil, errors.Join(err, closeSink())
	}
	return sink, closeSink, nil
}

func (l *kafkaLeg) Name() string                    { return "kafka" }
func (l *kafkaLeg) Consumer() (name, effect string) { return "billing", "charges" }
func (l *kafkaLeg) Destination() string             { return l.k.Topic("orders") }
func (l *kafkaLeg) Sink() relay.Sink                { return l.sink }
func (l *kafkaLeg) SinkSpec() sinkSpec {
	return sinkSpec{Kind: "kafka", Addrs: l.k.Brokers, Destination: l.Destination()}
}

// Subscriber returns a Subscriber in batch mode in the billing group.
func (l *kafkaLeg) Subscriber(_ context.Context, c *consumer.Consumer, beforeAck crashPoint) (idemq.Service, error) {
	cfg := idemqkafka.SubscriberConfig{
		Brokers: l.k.Brokers,
		GroupID: l.k.Group("billing"),
		Topics:  []string{l.k.Topic("orders")},
		Batch:   true,
		Test:    idemqkafka.TestConfig{BeforeCommit: beforeAck},
	}
	return idemqkafka.NewSubscriber(c, cfg)
}

func (l *kafkaLeg) Close() error { return errors.Join(l.closeSink(), l.k.Close()) }
