package nats_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/idemq/idemq/consumer"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// startCore subscribes (confirmed by the server) and runs the loop.
func (w *world) startCore(c *consumer.Consumer, subject string, cfg idemqnats.CoreConfig) *subscription {
	w.t.Helper()
	nc, err := w.e.n.Connect()
	if err != nil {
		w.t.Fatal(err)
	}
	s, err := idemqnats.NewCoreSubscriber(c, nc, subject, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(w.ctx)
	loop, err := s.Subscribe(ctx)
	if err != nil {
		cancel()
		w.t.Fatal(err)
	}
	sub := run(ctx, func(context.Context) error { return loop() }, nc.Close)
	stop := sub.cancel
	sub.cancel = func() { stop(); cancel() }
	w.t.Cleanup(func() { _ = sub.Stop() })
	return sub
}

// A relay re-publish through the core Sink reaches a queue group of two
// subscribers; each message is applied once, the copies are duplicates.
func TestCoreQueueGroupDropsPublisherDuplicates(t *testing.T) {
	w := newWorld(t)
	subject := w.e.n.Name("events")
	c := w.consumer(consumer.Config{}, nil)
	a := w.startCore(c, subject, idemqnats.CoreConfig{Queue: "q"})
	w.startCore(c, subject, idemqnats.CoreConfig{Queue: "q"})

	sink, err := idemqnats.NewCoreSink(w.e.nc, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch := relayBatch(subject, 40, 4)
	if err := sink.Publish(w.ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := sink.Publish(w.ctx, batch[:20]); err != nil { // the relay's successor
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
	w := newWorld(t)
	subject := w.e.n.Name("events")
	var results []consumer.Result
	w.startCore(w.consumer(consumer.Config{}, nil), subject, idemqnats.CoreConfig{
		BeforeAck: func(_ context.Context, _ []*consumer.Message, rs []consumer.Result) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			results = append(results, rs...)
			return nil
		},
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
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	if _, err := idemqnats.NewCoreSubscriber(c, w.e.nc, "", idemqnats.CoreConfig{}); !errors.Is(err, idemqnats.ErrConfig) {
		t.Errorf("empty subject: %v", err)
	}
	if _, err := idemqnats.NewCoreSubscriber(nil, w.e.nc, "x", idemqnats.CoreConfig{}); !errors.Is(err, idemqnats.ErrConfig) {
		t.Errorf("nil consumer: %v", err)
	}
}
