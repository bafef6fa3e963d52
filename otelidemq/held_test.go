package otelidemq_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// Held and skipped messages have counters of their own, and
// idemq.relay.failures counts attempted publishes only: a destination no
// route matches is held (reason no_route) round after round and never
// counted as a failure; a key's head that fails once counts one failure,
// its follower, put back behind it, one skip.
func TestRelayHeldAndSkippedCounters(t *testing.T) {
	tel := newTelemetry(t)
	ctx := t.Context()
	pool := testenv.Postgres(t)
	ob := newOutbox(t, pool)
	var flaky atomic.Int32
	router := relay.NewRouter()
	if err := router.Route("flaky", relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		f := relay.NewFailures(batch)
		for i := range batch {
			if f.Skip(i) {
				continue
			}
			if flaky.Add(1) == 1 {
				f.Fail(i, errors.New("broker busy"))
			}
		}
		return f.Err(ctx)
	})); err != nil {
		t.Fatal(err)
	}
	var held, published atomic.Int32
	r, err := relay.New(pool, ob, router, relay.Config{
		Logger: quiet,
		Retry:  idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Hooks: tel.RelayHooks(relay.Hooks{
			OnHeld:      func(relay.HeldEvent) { held.Add(1) },
			OnPublished: func(e relay.PublishedEvent) { published.Add(int32(len(e.Messages))) },
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Enqueue(ctx,
		outbox.Message{Destination: "flaky", Key: "k", Payload: []byte("0")},
		outbox.Message{Destination: "flaky", Key: "k", Payload: []byte("1")},
		outbox.Message{Destination: "nowhere", Key: "n", Payload: []byte("x")},
	); err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Stop() //nolint:errcheck // stopped below
	deadline := time.Now().Add(60 * time.Second)
	// Three rounds of the unrouted message: RetryNow brings it back, and
	// it is held again.
	for round := int32(1); round <= 3; round++ {
		for held.Load() < round {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the unrouted message was held %d times", round, held.Load())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if round == 3 {
			break
		}
		if _, err := ob.RetryNow(ctx, "nowhere"); err != nil {
			t.Fatal(err)
		}
	}
	for published.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("published %d of the flaky key's 2 messages", published.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}
	if st, err := ob.Stats(ctx); err != nil || st.Pending != 1 || st.Unrouted != 1 || st.Dead != 0 {
		t.Fatalf("outbox %+v (%v): want the unrouted message pending, counted, not dead", st, err)
	}
	m := collect(t, tel.reader)
	dest := func(d string) map[string]string { return map[string]string{"messaging.destination.name": d} }
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  int64
	}{
		{"idemq.relay.failures", dest("flaky"), 1},
		{"idemq.relay.skipped", dest("flaky"), 1},
		{"idemq.relay.failures", dest("nowhere"), 0},
		{"idemq.relay.held", map[string]string{"messaging.destination.name": "nowhere", "idemq.relay.hold_reason": "no_route"}, int64(held.Load())},
	} {
		if got := m.sum(c.name, c.attrs); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.attrs, got, c.want)
		}
	}
	if held.Load() < 3 {
		t.Errorf("held %d times, want at least 3 rounds", held.Load())
	}
}
