package nats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
	"github.com/idemq/idemq/transports/transporttest"
)

func TestConformanceJetStream(t *testing.T) {
	t.Parallel()
	transporttest.Run(t, func(t *testing.T) transporttest.Harness { return newHarness(t) })
}

// harness runs the conformance suite on a JetStream stream. Its duplicate
// window is the shortest JetStream allows (100 ms), and Publish re-sends a
// message the window dropped until the stream stored it: a producer that
// retries later than the window. So the suite's publisher duplicates do
// reach the subscriber and are dropped by the inbox, while a relay
// re-publish right after the publish is dropped by the stream itself.
type harness struct {
	t       *testing.T
	n       *testenv.NATSServer
	js      jetstream.JetStream
	stream  jetstream.Stream
	dlq     jetstream.Stream
	subject string
	dlqSubj string
}

// ackWait is short so that a crashed subscription's messages come back
// quickly.
const ackWait = 2 * time.Second

func newHarness(t *testing.T) *harness {
	n := testenv.NATS(t)
	js, err := jetstream.New(n.ConnectTB(t), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, n: n, js: js, subject: n.Name("orders"), dlqSubj: n.Name("orders-dlq")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if h.stream, err = n.CreateStream(ctx, js, jetstream.StreamConfig{
		Name: n.Name("ORDERS"), Subjects: []string{h.subject}, Duplicates: 100 * time.Millisecond,
	}); err != nil {
		t.Fatal(err)
	}
	if h.dlq, err = n.CreateStream(ctx, js, jetstream.StreamConfig{Name: n.Name("DLQ"), Subjects: []string{h.dlqSubj}}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) Features() transporttest.Features {
	return transporttest.Features{Redelivery: true, SharedGroup: true, Batch: true, DeadLetterDestination: true,
		PublishDedupe: true, OrderedPerKey: true}
}

func (h *harness) Publish(ctx context.Context, msgs ...transporttest.Message) error {
	pending := msgs
	for len(pending) > 0 {
		var dropped []transporttest.Message
		for _, m := range pending {
			out := nats.NewMsg(h.subject)
			out.Data = m.Payload
			if m.ID != "" {
				out.Header.Set(jetstream.MsgIDHeader, m.ID)
			}
			ack, err := h.js.PublishMsg(ctx, out)
			if err != nil {
				return err
			}
			if ack.Duplicate {
				dropped = append(dropped, m)
			}
		}
		if pending = dropped; len(pending) > 0 {
			select { // let the duplicate window pass
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(120 * time.Millisecond):
			}
		}
	}
	return nil
}

func (h *harness) Sink() (relay.Sink, string) {
	sink, err := idemqnats.NewJetStreamSink(h.js, idemqnats.SinkConfig{})
	if err != nil {
		h.t.Fatal(err)
	}
	return sink, h.subject
}

func (h *harness) DeadLetters(ctx context.Context) ([]string, error) {
	return streamIDs(ctx, h.dlq)
}

// streamIDs returns the original message id of every dead letter in s.
func streamIDs(ctx context.Context, s jetstream.Stream) ([]string, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return ids, err
		}
		ids = append(ids, m.Header.Get(idemqnats.HeaderDeadLetterID))
	}
	return ids, nil
}

func (h *harness) Subscriber(c *consumer.Consumer, opts transporttest.SubscribeOptions) idemq.Service {
	cfg := idemqnats.JetStreamSubscriberConfig{Batch: opts.Batch, DeadLetterSubject: h.dlqSubj, FetchWait: 200 * time.Millisecond, Logger: opts.Logger}
	cfg.Test.BeforeAck = opts.BeforeAck()
	// Each subscriber has its own connection, closed when it ends, as a
	// process of its own would.
	nc, err := h.n.Connect()
	if err != nil {
		h.t.Fatal(err)
	}
	s, err := subscriber(context.Background(), nc, h.n.Name("ORDERS"), opts.Group, c, cfg)
	if err != nil {
		nc.Close()
		h.t.Fatal(err)
	}
	return ownConn{s, nc}
}

// ownConn is a subscriber that closes its connection when Run returns.
type ownConn struct {
	*idemqnats.JetStreamSubscriber
	nc *nats.Conn
}

func (o ownConn) Run(ctx context.Context) error {
	defer o.nc.Close()
	return o.JetStreamSubscriber.Run(ctx)
}

// subscriber returns a JetStreamSubscriber on the durable pull consumer
// group of stream, created with explicit acks and a short AckWait.
func subscriber(ctx context.Context, nc *nats.Conn, stream, group string, c *consumer.Consumer, cfg idemqnats.JetStreamSubscriberConfig) (*idemqnats.JetStreamSubscriber, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: group, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	if err != nil {
		return nil, err
	}
	return idemqnats.NewJetStreamSubscriber(c, cons, js, cfg)
}
