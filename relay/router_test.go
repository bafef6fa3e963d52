package relay_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
)

// memSink is an in-memory destination: it records what it was given and
// wakes the readers of Received.
type memSink struct {
	mu      sync.Mutex
	changed *sync.Cond
	got     []relay.Message
}

func newMemSink() *memSink {
	s := &memSink{}
	s.changed = sync.NewCond(&s.mu)
	return s
}

func (s *memSink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, batch...)
	s.changed.Broadcast()
	return nil
}

func (s *memSink) received(ctx context.Context, n int) ([]relay.Message, error) {
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.changed.Broadcast()
	})
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.got) < n && ctx.Err() == nil {
		s.changed.Wait()
	}
	return slices.Clone(s.got), ctx.Err()
}

// TestRouterConformance runs the Sink suite against a Router whose failing
// destination is routed to a Sink that panics.
func TestRouterConformance(t *testing.T) {
	relaytest.TestSink(t, func(t *testing.T) relaytest.Target {
		sinks := map[string]*memSink{"orders": newMemSink(), "billing.invoices": newMemSink()}
		var r relay.Router // the zero value is ready to use
		for _, err := range []error{
			r.Route("orders", sinks["orders"]),
			r.RoutePrefix("billing.", sinks["billing.invoices"]),
			r.Route("boom", relay.SinkFunc(func(context.Context, relay.BatchID, []relay.Message) error { panic("boom") })),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		return relaytest.Target{
			Sink:         &r,
			Destinations: []string{"orders", "billing.invoices"},
			Failing:      "boom",
			Received: func(ctx context.Context, dest string, n int) ([]relay.Message, error) {
				return sinks[dest].received(ctx, n)
			},
		}
	})
}

func TestRouterPanickingSinkFailsItsPart(t *testing.T) {
	t.Parallel()
	var r relay.Router
	ok := newMemSink()
	if err := errors.Join(
		r.Route("ok", ok),
		r.Route("boom", relay.SinkFunc(func(context.Context, relay.BatchID, []relay.Message) error { panic("boom") })),
	); err != nil {
		t.Fatal(err)
	}
	batch := []relay.Message{msg("boom", "k"), msg("ok", "j"), msg("nowhere", "")}
	err := r.Publish(context.Background(), 0, batch)
	var pe *relay.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 2 || !errors.Is(pe.Failed[0], relay.ErrSinkPanicked) ||
		!errors.Is(pe.Failed[2], relay.ErrNoRoute) || !errors.Is(pe.Failed[2], relay.ErrSkipped) || idemq.IsPermanent(pe.Failed[2]) {
		t.Fatalf("Publish: %v", err)
	}
	if got, _ := ok.received(context.Background(), 1); len(got) != 1 {
		t.Fatalf("ok received %d messages, want 1", len(got))
	}
}

func TestNilSinksDoNotPanic(t *testing.T) {
	t.Parallel()
	batch := []relay.Message{msg("d", "k"), msg("d", "")}
	var nilRouter *relay.Router
	err := nilRouter.Publish(context.Background(), 0, batch)
	var pe *relay.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 2 || !errors.Is(pe.Failed[1], relay.ErrNoRoute) {
		t.Fatalf("nil Router: %v", err)
	}
	if nilRouter.Lookup("d") != nil || nilRouter.Route("d", newMemSink()) == nil || nilRouter.RoutePrefix("", newMemSink()) == nil {
		t.Fatal("nil Router: Lookup found a sink or Route succeeded")
	}
	var zero relay.Router
	if err := zero.Publish(context.Background(), 0, batch); !errors.As(err, &pe) || len(pe.Failed) != 2 {
		t.Fatalf("zero Router: %v", err)
	}
	if zero.Route("d", relay.SinkFunc(nil)) == nil || zero.Route("d", nilRouter) == nil {
		t.Fatal("Route accepted a nil sink")
	}
	if err := relay.SinkFunc(nil).Publish(context.Background(), 0, batch); err == nil {
		t.Fatal("nil SinkFunc: Publish returned nil")
	}
}
