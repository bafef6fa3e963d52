package franz_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// badTopics are names Kafka refuses, each with why.
var badTopics = map[string]string{
	"bad topic!":             "a blank and '!'",
	strings.Repeat("t", 250): "250 bytes",
	".":                      "\".\"",
	"..":                     "\"..\"",
	"orders/eu":              "a slash",
	"ordérs":                 "a non-ASCII letter",
	"":                       "empty",
}

// TestBadInputTxSinkNames: NewTxSink refuses a TxSink without its outbox's
// name and a watermark topic Kafka would refuse; without explicit names
// it derives both from the outbox, differently for another outbox, and
// the derived topic is one Kafka accepts.
func TestBadInputTxSinkNames(t *testing.T) {
	configError := func(err error, field string) bool {
		ce, ok := errors.AsType[*idemq.ConfigError](err)
		return ok && ce.Field == field && errors.Is(err, idemq.ErrConfig)
	}
	brokers := kgo.SeedBrokers("127.0.0.1:1") // never contacted
	if _, err := franz.NewTxSink(franz.TxConfig{TransactionalIDPrefix: "p-", WatermarkTopic: "w"}, brokers); !configError(err, "Outbox") {
		t.Errorf("NewTxSink without Outbox = %v, want a ConfigError for Outbox", err)
	}
	for topic, why := range badTopics {
		if topic == "" {
			continue // empty means derived
		}
		if _, err := franz.NewTxSink(franz.TxConfig{Outbox: "o", WatermarkTopic: topic}, brokers); !configError(err, "WatermarkTopic") {
			t.Errorf("NewTxSink(WatermarkTopic with %s) = %v, want a ConfigError for WatermarkTopic", why, err)
		}
	}
	if s, err := franz.NewTxSink(franz.TxConfig{Outbox: "o", WatermarkTopic: strings.Repeat("t", 249)}, brokers); err != nil {
		t.Errorf("NewTxSink(a 249-byte WatermarkTopic) = %v, want it accepted", err)
	} else {
		s.Close()
	}
	derived := func(outbox string) (string, string) {
		s, err := franz.NewTxSink(franz.TxConfig{Outbox: outbox}, brokers)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		prefix, topic := franz.TxNames(outbox)
		if s.TransactionalID(7) != prefix+"7" || s.WatermarkTopic() != topic {
			t.Errorf("outbox %q: transactional id %s and watermark topic %s, want TxNames' %s7 and %s", outbox, s.TransactionalID(7), s.WatermarkTopic(), prefix, topic)
		}
		if _, err := franz.NewTxSink(franz.TxConfig{Outbox: "o", WatermarkTopic: topic}, brokers); err != nil {
			t.Errorf("the derived watermark topic %q is refused: %v", topic, err)
		}
		return prefix, topic
	}
	p1, t1 := derived("7712741991429212289/shop/public.idemq_outbox")
	p2, t2 := derived("7712741991429212289/billing/public.idemq_outbox")
	if p1 == p2 || t1 == t2 {
		t.Errorf("two outboxes derive the same names: %s %s", p1, t1)
	}
}

// TestBadInputSubscriberTopics: NewSubscriber refuses a topic or a
// dead-letter topic Kafka would refuse, naming the field.
func TestBadInputSubscriberTopics(t *testing.T) {
	c, err := consumer.New(testenv.Postgres(t), "bad-topics", func(context.Context, pgx.Tx, *consumer.Message) error { return nil }, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for topic, why := range badTopics {
		if topic == "" {
			continue // refused as empty already
		}
		_, err := franz.NewSubscriber(c, franz.SubscriberConfig{GroupID: "g", Topics: []string{"orders", topic}})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "Topics" {
			t.Errorf("NewSubscriber(a topic with %s) = %v, want a ConfigError for Topics", why, err)
		}
		_, err = franz.NewSubscriber(c, franz.SubscriberConfig{GroupID: "g", Topics: []string{"orders"}, DeadLetterTopic: topic})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "DeadLetterTopic" {
			t.Errorf("NewSubscriber(a dead-letter topic with %s) = %v, want a ConfigError for DeadLetterTopic", why, err)
		}
	}
	if _, err := franz.NewSubscriber(c, franz.SubscriberConfig{GroupID: "g", Topics: []string{"orders.v1_eu-west"}, DeadLetterTopic: "orders.dead"}); err != nil {
		t.Errorf("NewSubscriber(legal names) = %v", err)
	}
}

// TestBadInputDestinationsToBadTopics: a message whose destination maps to
// a topic Kafka would refuse, or to a TxSink's own watermark topic (which
// would corrupt the watermarks), fails permanently, with the reason,
// instead of being retried or written.
func TestBadInputDestinationsToBadTopics(t *testing.T) {
	k := testenv.Kafka(t, 1, "orders")
	tx := newTxSink(t, k, franz.TxConfig{})
	for name, c := range map[string]struct {
		sink relay.Sink
		dest string
	}{
		"a TxSink's watermark topic": {tx, tx.WatermarkTopic()},
		"a blank and '!'":            {newSink(t, k), "bad topic!"},
		"250 bytes":                  {tx, strings.Repeat("t", 250)},
	} {
		m := relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: c.dest, Key: "k", Payload: []byte("{}")}, Partition: 3, LeaseToken: 1}
		err := c.sink.Publish(context.Background(), 0, []relay.Message{m})
		pe, ok := errors.AsType[*relay.PublishError](err)
		if !ok || !idemq.IsPermanent(pe.Failed[0]) || !errors.Is(pe.Failed[0], kerr.InvalidTopicException) {
			t.Errorf("a destination mapped to %s: %v, want a permanent InvalidTopicException", name, err)
		}
	}
}
