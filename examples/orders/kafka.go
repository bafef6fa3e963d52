package main

import (
	"context"
	"errors"
	"os"
	"strings"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

// kafkaLeg runs kfake, an in-process Kafka for trying it locally
// (KAFKA_BROKERS points it at real brokers, where it creates the topic),
// with a 3-partition "orders" topic, consumed by the billing service.
type kafkaLeg struct {
	brokers   []string
	stop      func()
	sink      relay.Sink
	closeSink func() error
}

const kafkaTopic = "orders"

func newKafkaLeg(ctx context.Context) (leg, error) {
	l := &kafkaLeg{stop: func() {}}
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		l.brokers = strings.Split(env, ",")
		client := &kafka.Client{Addr: kafka.TCP(l.brokers...)}
		resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
			{Topic: kafkaTopic, NumPartitions: 3, ReplicationFactor: -1}}})
		if err == nil && !errors.Is(resp.Errors[kafkaTopic], kafka.TopicAlreadyExists) {
			err = resp.Errors[kafkaTopic]
		}
		if err != nil {
			return nil, err
		}
	} else {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafkaTopic))
		if err != nil {
			return nil, err
		}
		l.brokers, l.stop = cluster.ListenAddrs(), cluster.Close
	}
	var err error
	if l.sink, l.closeSink, err = openKafkaSink(l.brokers); err != nil {
		l.stop()
		return nil, err
	}
	return l, nil
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
func (l *kafkaLeg) Destination() string             { return kafkaTopic }
func (l *kafkaLeg) Sink() relay.Sink                { return l.sink }
func (l *kafkaLeg) SinkSpec() sinkSpec {
	return sinkSpec{Kind: "kafka", Addrs: l.brokers, Destination: l.Destination()}
}

// Subscriber returns a Subscriber in batch mode in the billing group.
func (l *kafkaLeg) Subscriber(_ context.Context, c *consumer.Consumer, beforeAck crashPoint) (idemq.Service, error) {
	cfg := idemqkafka.SubscriberConfig{
		Brokers: l.brokers,
		GroupID: "billing",
		Topics:  []string{kafkaTopic},
		Batch:   true,
		Test:    idemqkafka.TestConfig{BeforeCommit: beforeAck},
	}
	return idemqkafka.NewSubscriber(c, cfg)
}

func (l *kafkaLeg) Close() error {
	err := l.closeSink()
	l.stop()
	return err
}
