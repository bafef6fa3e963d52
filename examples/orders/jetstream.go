package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

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
	n         *testenv.NATSServer
	sink      relay.Sink
	closeSink func() error
	cons      jetstream.Consumer // the demo's durable, once Subscriber made it
	stream    string
	subject   string
}

func newJetStreamLeg(ctx context.Context) (leg, error) {
	n, err := testenv.StartNATS(ctx)
	if err != nil {
		return nil, err
	}
	l := &jetStreamLeg{n: n, stream: n.Name("ORDERS"), subject: n.Name("orders")}
	fail := func(err error) (leg, error) { return nil, errors.Join(err, l.Close()) }
	if l.sink, l.closeSink, err = openJetStreamSink(ctx, []string{n.URL}); err != nil {
		return fail(err)
	}
	nc, err := n.Connect(nats.Name("idemq-demo-setup"))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	if _, err := n.CreateStream(ctx, js, jetstream.StreamConfig{Name: l.stream, Subjects: []string{l.subject}}); err != nil {
		return fail(err)
	}
	return l, nil
}

// openJetStreamSink returns a relay sink publishing to the NATS server at
// urls.
func openJetStreamSink(_ context.Context, urls []string) (relay.Sink, func() error, error) {
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Name("idemq-demo-relay"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, err
	}
	closeSink := func() error { nc.Close(); return nil }
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, nil, errors.Join(err, closeSink())
	}
	sink, err := idemqnats.NewJetStreamSink(js, idemqnats.SinkConfig{})
	if err != nil {
		return nil, nil, errors.Join(err, closeSink())
	}
	return sink, closeSink, nil
}

func (l *jetStreamLeg) Name() string                    { return "jetstream" }
func (l *jetStreamLeg) Consumer() (name, effect string) { return "shipping", "shipments" }
func (l *jetStreamLeg) SinkSpec() sinkSpec {
	return sinkSpec{Kind: "jetstream", Addrs: []string{l.n.URL}, Destination: l.subject}
}
func (l *jetStreamLeg) Destination() string    { return l.subject }
func (l *jetStreamLeg) Sink() relay.Sink       { return l.sink }
func (l *jetStreamLeg) DedupesPublishes() bool { return true }

// Subscriber returns a JetStreamSubscriber in batch mode on the durable
// "shipping" consumer, over a connection of its own that is closed when
// Run returns, as a separate process's would be.
func (l *jetStreamLeg) Subscriber(ctx context.Context, c *consumer.Consumer, beforeAck crashPoint) (idemq.Service, error) {
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
	l.cons = cons
	cfg := idemqnats.JetStreamSubscriberConfig{Batch: true, FetchWait: 200 * time.Millisecond,
		Test: idemqnats.TestConfig{BeforeAck: beforeAck}}
	s, err := idemqnats.NewJetStreamSubscriber(c, cons, js, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return ownConn{s, nc}, nil
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

// Settled waits until the durable consumer holds nothing pending or
// unacknowledged: the messages the killed consumer applied but never
// acknowledged come back only after AckWait, after the newer ones.
func (l *jetStreamLeg) Settled(ctx context.Context) error {
	for {
		info, err := l.cons.Info(ctx)
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jetstream: messages still pending: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *jetStreamLeg) Close() error {
	var err error
	if l.closeSink != nil {
		err = l.closeSink()
	}
	return errors.Join(err, l.n.Close())
}
