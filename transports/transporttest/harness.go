package transporttest

import (
	"context"
	"errors"
	"log/slog"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
)

// Features says what a transport guarantees, so the suite checks exactly
// that and says which scenarios it left out (t.Skip with the reason, never
// silently).
type Features struct {
	// Redelivery: a message the consumer did not acknowledge (crash between
	// the database commit and the ack / offset commit) is delivered again,
	// to the restarted or another subscription of the same Group. Kafka
	// (offsets) and JetStream (AckWait) have it; core NATS does not.
	Redelivery bool
	// SharedGroup: subscriptions with the same Group share the stream's
	// messages, and one leaving hands its share to the others (Kafka
	// consumer group rebalance, JetStream durable pull consumer, NATS queue
	// group).
	SharedGroup bool
	// Batch: the transport has a batch mode (SubscribeOptions.Batch); the
	// scenarios then run in both modes.
	Batch bool
	// DeadLetterDestination: the transport publishes dead letters to a
	// topic or subject of their own, which [Harness.DeadLetters] reads.
	DeadLetterDestination bool
	// PublishDedupe: the broker drops a republished message id itself
	// (JetStream's duplicate window), so a relay's re-publish never reaches
	// the consumer.
	PublishDedupe bool
	// OrderedPerKey: messages published with the same Key are applied in
	// publish order (Kafka partitions; a JetStream consumer with one
	// message in flight).
	OrderedPerKey bool
	// RequiresID: the protocol has no message without an id and so no
	// fallback id (Standard Webhooks signs the webhook-id). MissingID then
	// checks that such messages are refused, never applied, and hold back
	// none of the messages after them.
	RequiresID bool
}

// Message is a raw message as a producer would publish it, bypassing the
// outbox.
type Message struct {
	// ID goes into the transport's message-id header (Idempotency-Key on
	// Kafka, Nats-Msg-Id on NATS). Empty means no header at all: the
	// transport's fallback id applies (topic/partition/offset,
	// stream/sequence).
	ID string
	// Key orders messages (Kafka message key; NATS may ignore it).
	Key string
	// Payload is the message body; the suite never publishes a nil one.
	Payload []byte
}

// SubscribeOptions tells [Harness.Subscriber] how to run a subscription.
type SubscribeOptions struct {
	// Group names the subscription's share of the stream: subscriptions
	// with the same Group share the messages (and the committed position:
	// a restarted subscription of a Group resumes where the last one
	// acknowledged); different Groups each receive every message. The
	// harness maps it to a Kafka group id, a JetStream durable name, a
	// queue group; it must be unique to the Harness value.
	Group string
	// Batch runs the transport's batch mode (consumer.ProcessBatch) when
	// Features.Batch; the suite never sets it otherwise.
	Batch bool
	// Crash, if not nil, is called for every message after its
	// transaction committed (or it settled otherwise) and before the
	// transport acknowledges it, with the message as the consumer saw it.
	// When it returns true the subscription must die at once the way a
	// killed process would: acknowledge nothing more (not that message,
	// not any later one), stop consuming, release its connections, and
	// return a non-nil error from Run. Redelivery and group
	// membership then follow the broker's rules (offsets not committed,
	// AckWait expiry, session timeout or leave).
	Crash func(msg *consumer.Message, r consumer.Result) bool
	// Logger, if not nil, is the subscriber's logger (its Config.Logger),
	// for the scenarios that count its lines.
	Logger *slog.Logger
}

// Harness is what a transport implements to run the suite: a fresh stream
// for one test (a Kafka topic, a JetStream stream and subject) with its
// publisher, subscriber and relay sink. Each scenario gets its own Harness
// from the constructor passed to [Run], and so its own stream. Every method
// is called from the test goroutine (Subscribe's consumer runs wherever the
// transport runs it).
type Harness interface {
	// Features reports the transport's guarantees.
	Features() Features
	// Publish sends msgs to the stream as a raw producer would, in order,
	// and returns once the broker has accepted them all.
	Publish(ctx context.Context, msgs ...Message) error
	// Sink returns the transport's relay sink and the outbox destination
	// that reaches the stream under test. The harness closes whatever it
	// opens for it at test cleanup.
	Sink() (sink relay.Sink, destination string)
	// Subscriber returns a subscriber consuming the stream through c
	// (which the suite built, migrated and hooked to count outcomes); the
	// suite runs it with idemq.Start, which returns once it is Ready, and
	// stops it. Construction failures are reported with t.Fatal from the
	// harness. A subscriber that crashes (SubscribeOptions.Crash) returns a
	// non-nil error from Run.
	Subscriber(c *consumer.Consumer, opts SubscribeOptions) idemq.Service
	// DeadLetters returns the ids of the messages published to the
	// dead-letter destination so far (only called when
	// Features.DeadLetterDestination).
	DeadLetters(ctx context.Context) ([]string, error)
}

// errCrash is what the crash point of [SubscribeOptions.BeforeAck]
// returns.
var errCrash = errors.New("transporttest: crash")

// BeforeAck returns the crash point for the subscriber's
// Test.BeforeCommit or Test.BeforeAck: it returns an error, which stops
// the subscriber before it acknowledges anything more, for the first
// message opts.Crash picks; nil without Crash.
func (o SubscribeOptions) BeforeAck() func(context.Context, []*consumer.Message, []consumer.Result) error {
	if o.Crash == nil {
		return nil
	}
	return func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) error {
		for i := range msgs {
			if o.Crash(msgs[i], results[i]) {
				return errCrash
			}
		}
		return nil
	}
}
