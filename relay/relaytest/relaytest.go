// Package relaytest is the conformance suite for [relay.Sink]
// implementations: the rules of the Sink contract, checked against a real
// broker or endpoint, written once and run by each Sink's tests in a few
// lines, after Watermill's pubsub/tests and River's riverdrivertest.
//
// A Sink's test builds a [Target] per subtest (a Sink, fresh destinations it
// delivers to, one destination it fails, and a way to read what arrived)
// and calls [TestSink], which checks that:
//
//   - Order: every message of a batch spread over several destinations
//     arrives once, and the messages of one key arrive at a destination in
//     batch order, also when the key moves between destinations;
//   - SkipAfterFailure: once a message of a key fails, the later messages
//     of that key in the batch are reported as [relay.ErrSkipped] and not
//     delivered, while other keys and unkeyed messages are delivered
//     (partial failure, reported as a *[relay.PublishError] that names
//     exactly the failed indexes);
//   - Headers: the id, key, payload and headers arrive unchanged, and an
//     empty payload, no headers and no key are fine;
//   - Empty: an empty batch is delivered trivially;
//   - Cancelled: Publish under a cancelled context returns an error;
//   - Concurrent: concurrent Publish calls deliver everything.
//
// [RelayThroughput] and [OutboxMessages] are the outbound benchmark every
// transport runs: outbox, relay and Sink together.
package relaytest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// Target is one Sink under test.
type Target struct {
	// Sink is the Sink under test.
	Sink relay.Sink
	// Destinations are at least two destinations the Sink delivers to,
	// fresh for this Target: nothing else publishes there.
	Destinations []string
	// Failing is a destination the Sink fails every message for (one that
	// maps to no topic or subject, or a route to a failing or panicking
	// Sink).
	Failing string
	// Received waits until at least n messages arrived at destination, or
	// ctx is done, and returns every message that arrived there so far, in
	// arrival order, with the ID, Key, Payload and Headers the receiver
	// saw (the Sink's own id and key headers may be left in or out).
	Received func(ctx context.Context, destination string, n int) ([]relay.Message, error)
}

// TestSink runs the suite; newTarget is called once per subtest.
func TestSink(t *testing.T, newTarget func(t *testing.T) Target) {
	t.Run("Order", func(t *testing.T) { testOrder(t, target(t, newTarget)) })
	t.Run("SkipAfterFailure", func(t *testing.T) { testSkipAfterFailure(t, target(t, newTarget)) })
	t.Run("Headers", func(t *testing.T) { testHeaders(t, target(t, newTarget)) })
	t.Run("Empty", func(t *testing.T) { testEmpty(t, target(t, newTarget)) })
	t.Run("Cancelled", func(t *testing.T) { testCancelled(t, target(t, newTarget)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, target(t, newTarget)) })
}

func target(t *testing.T, newTarget func(t *testing.T) Target) Target {
	t.Helper()
	tg := newTarget(t)
	if tg.Sink == nil || len(tg.Destinations) < 2 || tg.Failing == "" || tg.Received == nil {
		t.Fatal("relaytest: Target needs a Sink, two Destinations, a Failing destination and Received")
	}
	return tg
}

// waitTimeout bounds every wait for deliveries.
const waitTimeout = 60 * time.Second

func message(dest, key, payload string) relay.Message {
	return relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: key, Payload: []byte(payload)}, CreatedAt: time.Now()}
}

// received reads destination until want messages arrived and checks that
// exactly the messages with the ids of want arrived, once each, with their
// key and payload, and that the messages of each key arrived in want's
// order.
func received(t *testing.T, tg Target, dest string, want []relay.Message) []relay.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	got, err := tg.Received(ctx, dest, len(want))
	if err != nil {
		t.Fatalf("Received(%s, %d): %v", dest, len(want), err)
	}
	byID := map[uuid.UUID]relay.Message{}
	for _, m := range want {
		byID[m.ID] = m
	}
	seen := map[uuid.UUID]bool{}
	pos := map[uuid.UUID]int{}
	for i, m := range want {
		pos[m.ID] = i
	}
	last := map[string]int{} // key -> position in want of its last arrival
	for _, m := range got {
		w, ok := byID[m.ID]
		switch {
		case !ok:
			t.Fatalf("%s: unexpected message %s (key %q, payload %q)", dest, m.ID, m.Key, m.Payload)
		case seen[m.ID]:
			t.Fatalf("%s: message %s arrived twice", dest, m.ID)
		case m.Key != w.Key || string(m.Payload) != string(w.Payload):
			t.Fatalf("%s: message %s arrived as key %q payload %q, sent key %q payload %q", dest, m.ID, m.Key, m.Payload, w.Key, w.Payload)
		}
		seen[m.ID] = true
		if m.Key != "" {
			if p, ok := last[m.Key]; ok && p > pos[m.ID] {
				t.Fatalf("%s: key %q: message %q arrived after %q", dest, m.Key, m.Payload, want[p].Payload)
			}
			last[m.Key] = pos[m.ID]
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%s: %d of %d messages arrived", dest, len(seen), len(want))
	}
	return got
}

func testOrder(t *testing.T, tg Target) {
	d0, d1 := tg.Destinations[0], tg.Destinations[1]
	var batch []relay.Message
	perDest := map[string][]relay.Message{}
	for i := range 60 {
		key := fmt.Sprint("k", i%4)
		dest := d0
		switch {
		case i%4 == 0 && i%8 == 0: // k0 moves between destinations
			dest = d1
		case i%4 == 1: // k1 lives on d1
			dest = d1
		}
		if i%10 == 9 {
			key = "" // unkeyed
		}
		m := message(dest, key, fmt.Sprint(key, ":", i))
		batch = append(batch, m)
		perDest[dest] = append(perDest[dest], m)
	}
	if err := tg.Sink.Publish(context.Background(), 0, batch); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	received(t, tg, d0, perDest[d0])
	received(t, tg, d1, perDest[d1])
}

func testSkipAfterFailure(t *testing.T, tg Target) {
	d0, d1, bad := tg.Destinations[0], tg.Destinations[1], tg.Failing
	batch := []relay.Message{
		0: message(d0, "a", "a0"),
		1: message(bad, "a", "a1"),
		2: message(d0, "a", "a2"),
		3: message(d0, "b", "b0"),
		4: message(bad, "", "u0"),
		5: message(d0, "", "u1"),
		6: message(d1, "b", "b1"),
		7: message(d1, "a", "a3"),
	}
	err := tg.Sink.Publish(context.Background(), 0, batch)
	var pe *relay.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("Publish: %v, want a *relay.PublishError", err)
	}
	if got, want := slices.Sorted(maps.Keys(pe.Failed)), []int{1, 2, 4, 7}; !slices.Equal(got, want) {
		t.Fatalf("failed indexes %v, want %v (%v)", got, want, pe)
	}
	for _, i := range []int{1, 4} {
		if e := pe.Failed[i]; e == nil || errors.Is(e, relay.ErrSkipped) {
			t.Errorf("message %d (to the failing destination): %v, want its own error", i, e)
		}
	}
	for _, i := range []int{2, 7} {
		if e := pe.Failed[i]; !errors.Is(e, relay.ErrSkipped) {
			t.Errorf("message %d (after a failed message of its key): %v, want relay.ErrSkipped", i, e)
		}
	}
	received(t, tg, d0, []relay.Message{batch[0], batch[3], batch[5]})
	received(t, tg, d1, []relay.Message{batch[6]})
}

func testHeaders(t *testing.T, tg Target) {
	d0 := tg.Destinations[0]
	withHeaders := message(d0, "k", `{"order":1}`)
	withHeaders.Headers = map[string]string{
		"Content-Type": "application/json",
		"Traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
	sent := maps.Clone(withHeaders.Headers)
	bare := message(d0, "", "")
	bare.Payload = nil
	if err := tg.Sink.Publish(context.Background(), 0, []relay.Message{withHeaders, bare}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	for _, m := range received(t, tg, d0, []relay.Message{withHeaders, bare}) {
		if m.ID != withHeaders.ID {
			continue
		}
		for k, v := range sent {
			if m.Headers[k] != v {
				t.Errorf("header %s arrived as %q, sent %q", k, m.Headers[k], v)
			}
		}
	}
}

func testEmpty(t *testing.T, tg Target) {
	if err := tg.Sink.Publish(context.Background(), 0, nil); err != nil {
		t.Fatalf("Publish(nil): %v", err)
	}
	if err := tg.Sink.Publish(context.Background(), 0, []relay.Message{}); err != nil {
		t.Fatalf("Publish(empty): %v", err)
	}
}

func testCancelled(t *testing.T, tg Target) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	batch := []relay.Message{message(tg.Destinations[0], "k", "x"), message(tg.Destinations[1], "", "y")}
	if err := tg.Sink.Publish(ctx, 0, batch); err == nil {
		t.Fatal("Publish under a cancelled context returned nil")
	}
}

func testConcurrent(t *testing.T, tg Target) {
	const calls, per = 4, 25
	batches := make([][]relay.Message, calls)
	var want []relay.Message
	for c := range batches {
		for i := range per {
			m := message(tg.Destinations[0], fmt.Sprint("c", c), fmt.Sprint(c, ":", i))
			batches[c] = append(batches[c], m)
			want = append(want, m)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, calls)
	for c := range batches {
		wg.Go(func() { errs[c] = tg.Sink.Publish(context.Background(), 0, batches[c]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	received(t, tg, tg.Destinations[0], want)
}
