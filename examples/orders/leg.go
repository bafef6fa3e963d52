package main

import (
	"context"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
)

// leg is one transport of the demo: the relay publishes the outbox into
// its broker through Sink, and a subscription wrapped around an idemq
// consumer applies what arrives. Each leg gets its own row in the table.
//
// A new transport joins the demo by adding a file with a constructor and
// registering it from an init function:
//
//	func init() { registerLeg(newJetStreamLeg) }
type leg interface {
	// Name labels the leg's row ("kafka", "jetstream").
	Name() string
	// Destination is the outbox destination that the relay routes to
	// Sink.
	Destination() string
	// Sink publishes outbox messages into the leg's broker, stamping the
	// outbox id as the message id.
	Sink() relay.Sink
	// Subscribe starts consuming through c and returns at once. crash,
	// when not nil, is called after every settled message and before the
	// ack / offset commit; when it returns true the subscription dies like
	// a killed process: nothing more is acknowledged.
	Subscribe(ctx context.Context, c *consumer.Consumer, crash func(*consumer.Message, consumer.Result) bool) (subscription, error)
	// Close stops the leg's broker and releases everything it opened.
	Close() error
}

// publishDeduper is an optional capability of a leg whose broker drops a
// re-published message id itself (JetStream's duplicate window): the demo
// then expects only the distinct messages to be delivered.
type publishDeduper interface {
	DedupesPublishes() bool
}

// subscription is a running consumer of a leg.
type subscription interface {
	// Stop stops gracefully (finish, acknowledge, leave) and waits; it
	// returns the error the subscription died of, nil after a clean run.
	Stop() error
	// Done is closed once the subscription has ended (crash or Stop).
	Done() <-chan struct{}
}

// legFactory starts a leg's broker.
type legFactory func(ctx context.Context) (leg, error)

// legFactories lists the legs in table order; Kafka is always first,
// others register from init functions.
var legFactories = []legFactory{newKafkaLeg}

func registerLeg(f legFactory) { legFactories = append(legFactories, f) }
