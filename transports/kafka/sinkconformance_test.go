package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

// The Sink passes the relay's Sink conformance suite on two topics; the
// failing destination maps to no topic.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		k := testenv.Kafka(t, 2, "a", "b")
		w := idemqkafka.NewWriter(k.Brokers...)
		t.Cleanup(func() { _ = w.Close() })
		sink, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{Topic: func(d string) string {
			if d == "fail" {
				return ""
			}
			return d
		}})
		if err != nil {
			t.Fatal(err)
		}
		return relaytest.Target{
			Sink:         sink,
			Destinations: []string{k.Topic("a"), k.Topic("b")},
			Failing:      "fail",
			Received: func(ctx context.Context, topic string, n int) ([]relay.Message, error) {
				for {
					got, err := k.ReadAll(ctx, topic)
					if err != nil || len(got) >= n {
						return received(got), err
					}
					if err := lifecycle.Sleep(ctx, 20*time.Millisecond); err != nil {
						return received(got), err
					}
				}
			},
		}
	})
}

// received turns Kafka records back into the outbox messages they carry.
func received(records []kafka.Message) []relay.Message {
	out := make([]relay.Message, len(records))
	for i, r := range records {
		m := outbox.Message{Destination: r.Topic, Key: string(r.Key), Payload: r.Value, Headers: map[string]string{}}
		for _, h := range r.Headers {
			m.Headers[h.Key] = string(h.Value)
		}
		m.ID, _ = uuid.Parse(m.Headers[idemqkafka.IDHeaderDefault])
		out[i] = relay.Message{Message: m}
	}
	return out
}
