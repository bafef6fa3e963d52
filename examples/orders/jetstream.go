package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// jetStreamAckWait is short so that the messages the killed consumer
// applied but never acknowledged come back quickly.
const jetStreamAckWait = time.Second

// jetStreamLeg runs an in-process NATS server with JetStream (NATS_URL
// points it at a real one, where the stream is recreated) with an "ORDERS"
// stream on the "orders.created" subject (not "orders", the Kafka topic:
// the relay routes by destination), a durable pull consumer "shipping" and
// the JetStream relay sink. The stream's duplicate window (two minutes) drops
// the producer's re-sends, which carry the same Nats-Msg-Id, before the
// consumer sees them; the inbox drops the redeliveries after the crash.
type jetStreamLeg struct {
	url       string
	stop      func()
	sink      relay.Sink
	closeSink func() error
	cons      jetstream.Consumer // the demo's durable, once Subscriber made it
	stream    string
	subject   string
}

func newJetStreamLeg(ctx context.Context) (leg, error) {
	url, stop, err := startNATS()
	if err != nil {
		return nil, err
	}
	l := &jetStreamLeg{url: url, stop: stop, stream: "ORDERS", subject: "orders.created"}
	fail := func(err error) (leg, error) { return nil, errors.Join(err, l.Close()) }
	if l.sink, l.closeSink, err = openJetStreamSink(ctx, []string{url}); err != nil {
		return fail(err)
	}
	nc, err := nats.Connect(url, nats.Name("idemq-demo-setup"))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	// A stream left by an earlier run would hold its orders too.
	if err := js.DeleteStream(ctx, l.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fail(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: l.stream, Subjects: []string{l.subject}}); err != nil {
		return fail(err)
	}
	return l, nil
}

// startNATS returns the URL of NATS_URL or, when that is unset, of a
// nats-server with JetStream started in-process on a temporary directory;
// stop shuts that server down and removes the directory.
func startNATS() (url string, stop func(), err error) {
	if url := os.Getenv("NATS_URL"); url != "" {
		return url, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "idemq-demo-nats")
	if err != nil {
		return "", nil, err
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		return "", nil, errors.Join(err, os.RemoveAll(dir))
	}
	stop = func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
	srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		stop()
		return "", nil, errors.New("in-process nats-server not ready after 20s")
	}
	return srv.ClientURL(), stop, nil
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
	return sinkSpec{Kind: "jetstream", Addrs: []string{l.url}, Destination: l.subject}
}
func (l *jetStreamLeg) Destination() string    { return l.subject }
func (l *jetStreamLeg) Sink() relay.Sink       { return l.sink }
func (l *jetStreamLeg) DedupesPublishes() bool { return true }

// Subscriber returns a JetStreamSubscriber in batch mode on the durable
// "shipping" consumer, over a connection of its own that is closed when
// Run returns, as a separate process's would be.
func (l *jetStreamLeg) Subscriber(ctx context.Context, c *consumer.Consumer, beforeAck crashPoint) (idemq.Service, error) {
	nc, err := nats.Connect(l.url, nats.Name("idemq-demo-shipping"))
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
	l.stop()
	return err
}
