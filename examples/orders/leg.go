package main

import (
	"context"
	"fmt"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
)

// leg is one transport of the demo: the relay publishes the outbox into
// its broker through Sink, and a subscription wrapped around an idemq
// consumer applies what arrives. Each leg gets its own row in the table.
//
// A new transport joins the demo with a file holding its leg and its
// constructor listed in legFactories.
type leg interface {
	// Name labels the leg's row ("kafka", "jetstream").
	Name() string
	// Destination is the outbox destination that the relay routes to
	// Sink.
	Destination() string
	// Sink publishes outbox messages into the leg's broker, stamping the
	// outbox id as the message id.
	Sink() relay.Sink
	// SinkSpec tells a relay in another process how to reach the broker.
	SinkSpec() sinkSpec
	// Consumer names the service that applies the leg's messages and its
	// effect ("billing", "charges").
	Consumer() (name, effect string)
	// Subscriber returns a subscriber consuming through c, with
	// beforeAck (nil or not) as its crash point between the commit and the
	// ack / offset commit: an error there kills it like a killed process,
	// nothing more is acknowledged, and Run returns the error.
	Subscriber(ctx context.Context, c *consumer.Consumer, beforeAck crashPoint) (idemq.Service, error)
	// Close stops the leg's broker and releases everything it opened.
	Close() error
}

// publishDeduper is an optional capability of a leg whose broker drops a
// re-published message id itself (JetStream's duplicate window): the demo
// then expects only the distinct messages to be delivered.
type publishDeduper interface {
	DedupesPublishes() bool
}

// crashPoint is the demo's crash point between commit and ack.
type crashPoint = func(context.Context, []*consumer.Message, []consumer.Result) error

// settler is an optional capability of a leg whose broker redelivers what
// a killed consumer left unacknowledged only later (JetStream's AckWait):
// Settled waits until the broker holds nothing unacknowledged for the
// demo's consumer, so the counts include those redeliveries.
type settler interface {
	Settled(ctx context.Context) error
}

// legFactory starts a leg's broker.
type legFactory func(ctx context.Context) (leg, error)

// legFactories returns the legs' constructors in table order.
func legFactories() []legFactory { return []legFactory{newKafkaLeg, newJetStreamLeg} }

// sinkSpec is how a relay process reaches a leg's broker.
type sinkSpec struct {
	Kind        string // "kafka" or "jetstream"
	Addrs       []string
	Destination string
}

// openSink connects to the broker of s and returns its sink and what
// closes the connection.
func openSink(ctx context.Context, s sinkSpec) (relay.Sink, func() error, error) {
	switch s.Kind {
	case "kafka":
		return openKafkaSink(s.Addrs)
	case "jetstream":
		return openJetStreamSink(ctx, s.Addrs)
	}
	return nil, nil, fmt.Errorf("unknown sink kind %q", s.Kind)
}
