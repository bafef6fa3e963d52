package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

func init() { registerLeg(newJetStreamLeg) }

// jetStreamAckWait is short so that the messages the killed consumer
// applied but never acknowledged come back quickly.
const jetStreamAckWait = time.Second

// jetStreamLeg runs an in-process NATS server with JetStream
// (IDEMQ_TEST_NATS_URL points it at a real one) with an "ORDERS" stream on
// the "orders" subject, a durable pull consumer "shipping" and the
// JetStream relay sink. The stream's duplicate window (two minutes) drops
// the producer's re-sends, which carry the same Nats-Msg-Id, before the
// consumer sees them; the inbox drops the redeliveries after the crash.
type jetStreamLeg struct {
	n       *testenv.NATSServer
	nc      *nats.Conn
	js      jetstream.JetStream
	sink    *idemqnats.JetStreamSink
	stream  string
	subject string
}

func newJetStreamLeg(ctx context.Context) (leg, error) {
	n, err := testenv.StartNATS(ctx)
	if err != nil {
		return nil, err
	}
	l := &jetStreamLeg{n: n, stream: n.Name("ORDERS"), subject: n.Name("orders")}
	fail := func(err error) (leg, error) { return nil, errors.Join(err, l.Close()) }
	if l.nc, err = n.Connect(nats.Name("idemq-demo-relay")); err != nil {
		return fail(err)
	}
	if l.js, err = jetstream.New(l.nc, jetstream.WithPublishAsyncTimeout(10*time.Second)); err != nil {
		return fail(err)
	}
	if _, err := n.CreateStream(ctx, l.js, jetstream.StreamConfig{Name: l.stream, Subjects: []string{l.subject}}); err != nil {
		return fail(err)
	}
	if l.sink, err = idemqnats.NewJetStreamSink(l.js, idemqnats.SinkConfig{}); err != nil {
		return fail(err)
	}
	return l, nil
}

func (l *jetStreamLeg) Name() string           { return "jetstream" }
func (l *jetStreamLeg) Destination() string    { return l.subject }
func (l *jetStreamLeg) Sink() relay.Sink       { return l.sink }
func (l *jetStreamLeg) DedupesPublishes() bool { return true }

var errJetStreamCrash = errors.New("demo: consumer killed between commit and ack")

// Subscribe runs a JetStreamSubscriber in batch mode on the durable
// "shipping" consumer, over a connection of its own that is closed when
// it ends, as a separate process's would be.
func (l *jetStreamLeg) Subscribe(ctx context.Context, c *consumer.Consumer, crash func(*consumer.Message, consumer.Result) bool) (subscription, error) {
	nc, err := l.n.Connect(nats.Name("idemq-demo-shipping"))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, l.stream, jetstream.ConsumerConfig{
		Durable: "shipping", AckPolicy: jetstream.AckExplicitPolicy, AckWait: jetStreamAckWait,
	})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream consumer: %w", err)
	}
	cfg := idemqnats.JetStreamConfig{Batch: true, FetchWait: 200 * time.Millisecond}
	if crash != nil {
		cfg.BeforeAck = func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) error {
			for i := range msgs {
				if crash(msgs[i], results[i]) {
					return errJetStreamCrash
				}
			}
			return nil
		}
	}
	s, err := idemqnats.NewJetStreamSubscriber(c, cons, js, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := &jetStreamSubscription{runningSubscriber{cancel: cancel, done: make(chan struct{})}, cons}
	go func() {
		defer close(sub.done)
		sub.err = s.Run(ctx)
		nc.Close()
	}()
	return sub, nil
}

// jetStreamSubscription is a running JetStreamSubscriber whose Stop first
// lets it work off everything the durable consumer still holds: the
// messages the killed consumer applied but never acknowledged come back
// only after AckWait, after the newer ones.
type jetStreamSubscription struct {
	runningSubscriber
	cons jetstream.Consumer
}

func (s *jetStreamSubscription) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		select {
		case <-s.done: // crashed or failed: nothing to wait for
			return s.runningSubscriber.Stop()
		default:
		}
		info, err := s.cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return s.runningSubscriber.Stop()
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("jetstream: messages still pending at stop: %w", ctx.Err()), s.runningSubscriber.Stop())
		case <-s.done:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *jetStreamLeg) Close() error {
	if l.nc != nil {
		l.nc.Close()
	}
	return l.n.Close()
}
