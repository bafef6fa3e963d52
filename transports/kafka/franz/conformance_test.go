package franz_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
	"github.com/idemq/idemq/transports/transporttest"
)

// The franz-go Subscriber passes the transport conformance suite reading
// committed data behind the TxSink (the inbox stays behind the
// transactions). The plain Sink passes relaytest's suite
// (TestSinkConformance); the Subscriber's read_uncommitted mode differs
// only in the isolation level it asks the broker for.
func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T) transporttest.Harness { return newHarness(t, true) })
}

// harness runs the conformance suite on a 3-partition topic.
type harness struct {
	t  *testing.T
	k  *testenv.KafkaCluster
	tx bool
}

func newHarness(t *testing.T, tx bool) *harness {
	return &harness{t: t, k: testenv.Kafka(t, 3, "orders", "orders.dlq"), tx: tx}
}

func (h *harness) Features() transporttest.Features {
	// PublishDedupe: a relay's successor deletes what the TxSink committed
	// (its watermark) instead of publishing it again, and aborted
	// transactions never reach a read_committed reader.
	return transporttest.Features{Redelivery: true, SharedGroup: true, Batch: true, DeadLetterDestination: true, OrderedPerKey: true, PublishDedupe: h.tx}
}

func (h *harness) Publish(ctx context.Context, msgs ...transporttest.Message) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(h.k.Brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		return err
	}
	defer cl.Close()
	out := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		out[i] = &kgo.Record{Topic: h.k.Topic("orders"), Value: m.Payload}
		if m.Key != "" {
			out[i].Key = []byte(m.Key)
		}
		if m.ID != "" {
			out[i].Headers = []kgo.RecordHeader{{Key: franz.IDHeaderDefault, Value: []byte(m.ID)}}
		}
	}
	return cl.ProduceSync(ctx, out...).FirstErr()
}

func (h *harness) Sink() (relay.Sink, string) {
	if h.tx {
		return newTxSink(h.t, h.k, franz.TxConfig{}), h.k.Topic("orders")
	}
	return newSink(h.t, h.k), h.k.Topic("orders")
}

func (h *harness) DeadLetters(ctx context.Context) ([]string, error) {
	recs, err := readCommitted(ctx, h.k, h.k.Topic("orders.dlq"))
	var ids []string
	for _, r := range recs {
		for _, hd := range r.Headers {
			if hd.Key == franz.IDHeaderDefault {
				ids = append(ids, string(hd.Value))
			}
		}
	}
	return ids, err
}

func (h *harness) Subscriber(c *consumer.Consumer, opts transporttest.SubscribeOptions) idemq.Service {
	s, err := franz.NewSubscriber(c, franz.SubscriberConfig{
		GroupID:         h.k.Group(opts.Group),
		Topics:          []string{h.k.Topic("orders")},
		ReadCommitted:   h.tx,
		Batch:           opts.Batch,
		DeadLetterTopic: h.k.Topic("orders.dlq"),
		Test:            franz.TestConfig{BeforeCommit: opts.BeforeAck()},
		Logger:          opts.Logger,
	}, kgo.SeedBrokers(h.k.Brokers...), kgo.FetchMaxWait(250*time.Millisecond),
		kgo.HeartbeatInterval(250*time.Millisecond), kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second))
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}
