package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

// A subject no stream captures yet is an outage of that destination, not
// a reason to dead-letter: a relay retries its messages (several failed
// rounds, no dead letter, nothing lost), and once the stream is created
// they are delivered, in order.
func TestJetStreamSinkNoStreamIsRetriedUntilCreated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, jetstream.StreamConfig{})
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int64
	r, err := relay.New(pool, ob, sink, relay.Config{
		// Quick retries; attempts to spare: a permanent error would
		// dead-letter on the first one anyway.
		Retry:  idemq.Retry{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 1000},
		Hooks:  relay.Hooks{OnFailed: func(relay.FailedEvent) { failed.Add(1) }},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Stop() })

	later := e.n.Name("later")
	var msgs []outbox.Message
	for i := range 3 {
		msgs = append(msgs, outbox.Message{Destination: later, Key: "k", Payload: fmt.Appendf(nil, "m%d", i)})
	}
	if err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "several failed rounds", func() bool { return failed.Load() >= 5 })
	st, err := ob.Stats(ctx)
	if err != nil || st.Pending != 3 || st.Dead != 0 {
		t.Fatalf("outbox %+v (%v) while no stream captures the subject; want 3 pending, no dead letter", st, err)
	}

	stream, err := e.n.CreateStream(ctx, e.js, jetstream.StreamConfig{Name: e.n.Name("LATER"), Subjects: []string{later}})
	if err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "delivery once the stream exists", func() bool {
		st, err := ob.Stats(ctx)
		return err == nil && st.Pending == 0
	})
	if st, _ := ob.Stats(ctx); st.Dead != 0 {
		t.Fatalf("%d dead letters", st.Dead)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(m.Data()), fmt.Sprintf("m%d", i); got != want {
			t.Fatalf("message %d is %q, want %q", i, got, want)
		}
	}
}
