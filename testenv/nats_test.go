package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestNATSPublishesAndConsumes(t *testing.T) {
	n := NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(n.ConnectTB(t))
	if err != nil {
		t.Fatal(err)
	}
	subject := n.Name("orders")
	s, err := n.CreateStream(ctx, js, jetstream.StreamConfig{Name: n.Name("ORDERS"), Subjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := js.Publish(ctx, subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != 3 {
		t.Fatalf("fetched %d messages, want 3", got)
	}
}

func TestNATSNamesAreIsolatedPerServer(t *testing.T) {
	a, b := NATS(t), NATS(t)
	if a.Name("ORDERS") == b.Name("ORDERS") {
		t.Fatalf("two servers share stream name %s", a.Name("ORDERS"))
	}
}

func TestNATSRestartKeepsStreamAndClientReconnects(t *testing.T) {
	n := NATS(t)
	if n.External() {
		t.Skip("Restart needs the in-process server; " + NATSURLEnv + " is set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := n.ConnectTB(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := n.Name("orders")
	if _, err := n.CreateStream(ctx, js, jetstream.StreamConfig{Name: n.Name("ORDERS"), Subjects: []string{subject}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, []byte("before")); err != nil {
		t.Fatal(err)
	}
	url := n.URL
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	if n.URL != url {
		t.Fatalf("restart moved the server from %s to %s", url, n.URL)
	}
	// The same connection comes back by itself; publish until it has.
	for {
		if _, err := js.Publish(ctx, subject, []byte("after")); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("publish after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s, err := js.Stream(ctx, n.Name("ORDERS"))
	if err != nil {
		t.Fatal(err)
	}
	if msgs := s.CachedInfo().State.Msgs; msgs != 2 {
		t.Fatalf("stream holds %d messages after restart, want 2", msgs)
	}
}
