package nats_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/testenv/conformance"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

func TestConformanceJetStream(t *testing.T) {
	conformance.Run(t, func(t *testing.T) conformance.Harness { return newHarness(t) })
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

func (h *harness) Features() conformance.Features {
	return conformance.Features{Redelivery: true, SharedGroup: true, Batch: true, DeadLetterDestination: true,
		PublishDedupe: true, OrderedPerKey: true}
}

func (h *harness) Publish(ctx context.Context, msgs ...conformance.Message) error {
	pending := msgs
	for len(pending) > 0 {
		var dropped []conformance.Message
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

// streamIDs returns the Nats-Msg-Id of every message in s.
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
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids, nil
}

var errCrash = errors.New("conformance: crash")

func (h *harness) Subscribe(ctx context.Context, c *consumer.Consumer, opts conformance.SubscribeOptions) conformance.Subscription {
	cfg := idemqnats.JetStreamConfig{Batch: opts.Batch, DeadLetterSubject: h.dlqSubj, FetchWait: 200 * time.Millisecond}
	if opts.Crash != nil {
		cfg.BeforeAck = func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) error {
			for i := range msgs {
				if opts.Crash(msgs[i], results[i]) {
					return errCrash
				}
			}
			return nil
		}
	}
	// Each subscription has its own connection, closed when it ends, as a
	// process of its own would.
	nc, err := h.n.Connect()
	if err != nil {
		h.t.Fatal(err)
	}
	s, err := subscriber(ctx, nc, h.n.Name("ORDERS"), opts.Group, c, cfg)
	if err != nil {
		nc.Close()
		h.t.Fatal(err)
	}
	return run(ctx, s.Run, nc.Close)
}

// subscriber returns a JetStreamSubscriber on the durable pull consumer
// group of stream, created with explicit acks and a short AckWait.
func subscriber(ctx context.Context, nc *nats.Conn, stream, group string, c *consumer.Consumer, cfg idemqnats.JetStreamConfig) (*idemqnats.JetStreamSubscriber, error) {
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

// subscription runs a subscriber's Run in a goroutine.
type subscription struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func run(ctx context.Context, fn func(context.Context) error, cleanup func()) *subscription {
	ctx, cancel := context.WithCancel(ctx)
	sub := &subscription{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(sub.done)
		sub.err = fn(ctx)
		cleanup()
	}()
	return sub
}

func (s *subscription) Stop() error {
	s.cancel()
	<-s.done
	return s.err
}

func (s *subscription) Done() <-chan struct{} { return s.done }
