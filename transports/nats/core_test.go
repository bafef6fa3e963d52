package nats_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
	"github.com/idemq/idemq/transports/transporttest"
)

// startCore runs a CoreSubscriber on a connection of its own until the
// test ends (or Stop); it returns once the subscription is confirmed.
func (w *world) startCore(c *consumer.Consumer, subject string, cfg idemqnats.CoreSubscriberConfig) *idemq.Running {
	w.t.Helper()
	nc, err := w.e.n.Connect()
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(nc.Close)
	s, err := idemqnats.NewCoreSubscriber(c, nc, subject, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	running, err := idemq.Start(w.ctx, s)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = running.Stop() })
	return running
}

// A relay re-publish through the core Sink reaches a queue group of two
// subscribers; each message is applied once, the copies are duplicates.
func TestCoreQueueGroupDropsPublisherDuplicates(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	subject := w.e.n.Name("events")
	c := w.consumer(consumer.Config{}, nil)
	a := w.startCore(c, subject, idemqnats.CoreSubscriberConfig{Queue: "q"})
	w.startCore(c, subject, idemqnats.CoreSubscriberConfig{Queue: "q"})

	sink, err := idemqnats.NewCoreSink(w.e.nc, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch := relayBatch(subject, 40, 4)
	if err := sink.Publish(w.ctx, 0, batch); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(w.ctx, 0, batch[:20]); err != nil { // the relay's successor
		t.Fatal(err)
	}
	w.waitFor("every copy settled", func() bool { return w.count(consumer.Applied)+w.count(consumer.Duplicate) == 60 })
	if err := a.Stop(); err != nil {
		t.Fatalf("graceful Stop: %v", err)
	}
	got := w.effects()
	for _, m := range batch {
		if got[m.ID.String()] != 1 {
			t.Errorf("message %s applied %d times", m.ID, got[m.ID.String()])
		}
	}
	if d := w.count(consumer.Duplicate); d != 20 {
		t.Errorf("duplicates %d, want 20", d)
	}
}

func TestCoreMessageWithoutIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	subject := w.e.n.Name("events")
	var results []consumer.Result
	w.startCore(w.consumer(consumer.Config{}, nil), subject, idemqnats.CoreSubscriberConfig{
		Test: idemqnats.TestConfig{BeforeAck: func(_ context.Context, _ []*consumer.Message, rs []consumer.Result) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			results = append(results, rs...)
			return nil
		}},
	})
	if err := w.e.nc.PublishMsg(&nats.Msg{Subject: subject, Data: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	w.waitFor("dead-lettered", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(results) == 1
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(results) != 1 || !errors.Is(results[0].Err, consumer.ErrInvalidMessage) {
		t.Fatalf("results %v, want one ErrInvalidMessage", results)
	}
}

func TestNewCoreSubscriberValidates(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	if _, err := idemqnats.NewCoreSubscriber(c, w.e.nc, "", idemqnats.CoreSubscriberConfig{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("empty subject: %v", err)
	}
	if _, err := idemqnats.NewCoreSubscriber(nil, w.e.nc, "x", idemqnats.CoreSubscriberConfig{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("nil consumer: %v", err)
	}
}

func TestCoreSubscriberRunsAgainAfterRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	subject := w.e.n.Name("events")
	s, err := idemqnats.NewCoreSubscriber(w.consumer(consumer.Config{}, nil), w.e.nc, subject, idemqnats.CoreSubscriberConfig{})
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunTwice(t, s, func(round int) {
		// Ready means subscribed: a message published now is delivered.
		m := nats.NewMsg(subject)
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprint("m-", round))
		if err := w.e.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		w.waitFor("the message applied", func() bool { return len(w.effects()) == round+1 })
	})
}

// TestCoreDatabaseOutage: core NATS cannot redeliver, so a message the
// database could not take is held in the subscriber, the messages behind
// it waiting in the subscription, until the database is back: none lost,
// none out of its key's order, the outage logged once.
func TestCoreDatabaseOutage(t *testing.T) {
	t.Parallel()
	n := testenv.NATS(t)
	transporttest.DatabaseOutage(t, &coreHarness{t: t, n: n, nc: n.ConnectTB(t), subject: n.Name("orders")})
}

// coreHarness is the transporttest.Harness of a core NATS subject, for
// the scenarios core NATS can run: one publisher connection and one
// subscription receive in publish order.
type coreHarness struct {
	t       *testing.T
	n       *testenv.NATSServer
	nc      *nats.Conn
	subject string
}

func (h *coreHarness) Features() transporttest.Features {
	return transporttest.Features{OrderedPerKey: true}
}

func (h *coreHarness) Publish(ctx context.Context, msgs ...transporttest.Message) error {
	for _, m := range msgs {
		out := nats.NewMsg(h.subject)
		out.Data = m.Payload
		if m.ID != "" {
			out.Header.Set(idemqnats.IDHeaderDefault, m.ID)
		}
		if err := h.nc.PublishMsg(out); err != nil {
			return err
		}
	}
	return h.nc.FlushWithContext(ctx)
}

func (h *coreHarness) Sink() (relay.Sink, string) {
	sink, err := idemqnats.NewCoreSink(h.nc, idemqnats.SinkConfig{})
	if err != nil {
		h.t.Fatal(err)
	}
	return sink, h.subject
}

func (h *coreHarness) DeadLetters(context.Context) ([]string, error) {
	return nil, errors.New("core NATS has no dead-letter subject")
}

func (h *coreHarness) Subscriber(c *consumer.Consumer, opts transporttest.SubscribeOptions) idemq.Service {
	cfg := idemqnats.CoreSubscriberConfig{Logger: opts.Logger}
	cfg.Test.BeforeAck = opts.BeforeAck()
	s, err := idemqnats.NewCoreSubscriber(c, h.n.ConnectTB(h.t), h.subject, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}
