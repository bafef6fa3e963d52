package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/relay"
)

// Bad input to the relay's public API: each case is refused with an error
// that names what to change, or handled the way the documentation says.

// TestBadInputLeaseTTLBelowTheMinimumIsRefused: a lease of a few nanoseconds made
// Run panic on time.NewTicker, and one under a microsecond was stored as
// no lease at all; New refuses both.
func TestBadInputLeaseTTLBelowTheMinimumIsRefused(t *testing.T) {
	b := setup(t)
	for _, ttl := range []time.Duration{time.Nanosecond, 2 * time.Nanosecond, 999 * time.Nanosecond, relay.LeaseTTLMin - 1, -time.Second} {
		_, err := relay.New(b.pool, b.ob, &recorder{}, relay.Config{LeaseTTL: ttl})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "LeaseTTL" || !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(LeaseTTL: %v) = %v, want a ConfigError for LeaseTTL", ttl, err)
		}
	}
	if _, err := relay.New(b.pool, b.ob, &recorder{}, relay.Config{LeaseTTL: relay.LeaseTTLMin}); err != nil {
		t.Errorf("New(LeaseTTL: LeaseTTLMin) = %v", err)
	}
}

// TestBadInputRunWithCancelledContextReturnsNil: a relay whose context is done
// before it starts stops cleanly, as the idemq.Service contract says.
func TestBadInputRunWithCancelledContextReturnsNil(t *testing.T) {
	b := setup(t)
	r := newRelay(t, b, &recorder{}, relay.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("Run(cancelled context) = %v, want nil", err)
	}
}

// TestBadInputIntervalsBelowTheMinimumAreRefused: a PollInterval or StatsInterval
// of a nanosecond made an idle relay poll or scan the outbox in a busy
// loop; New refuses each below its minimum, naming the field, and accepts
// the minimum itself.
func TestBadInputIntervalsBelowTheMinimumAreRefused(t *testing.T) {
	b := setup(t)
	for field, c := range map[string]struct {
		least time.Duration
		with  func(time.Duration) relay.Config
	}{
		"PollInterval":  {relay.PollIntervalMin, func(d time.Duration) relay.Config { return relay.Config{PollInterval: d} }},
		"StatsInterval": {relay.StatsIntervalMin, func(d time.Duration) relay.Config { return relay.Config{StatsInterval: d} }},
	} {
		least, with := c.least, c.with
		for _, d := range []time.Duration{time.Nanosecond, least - 1, -time.Second} {
			_, err := relay.New(b.pool, b.ob, &recorder{}, with(d))
			if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != field || !errors.Is(err, idemq.ErrConfig) {
				t.Errorf("New(%s: %v) = %v, want a ConfigError for %s", field, d, err, field)
			}
		}
		if _, err := relay.New(b.pool, b.ob, &recorder{}, with(least)); err != nil {
			t.Errorf("New(%s: %v) = %v, want it accepted", field, least, err)
		}
	}
}

// TestBadInputTypedNilSinkIsRefused: a custom Sink that is a nil pointer
// (a (*recorder)(nil), which sink == nil misses), a nil SinkFunc and a
// nil *Router are refused by New and by the Router's routes with an
// idemq.ErrConfig naming the sink, instead of panicking in the first
// batch.
func TestBadInputTypedNilSinkIsRefused(t *testing.T) {
	b := setup(t)
	var (
		custom *recorder
		fn     relay.SinkFunc
		router *relay.Router
	)
	for name, sink := range map[string]relay.Sink{"nil": nil, "typed-nil custom Sink": custom, "nil SinkFunc": fn, "nil *Router": router} {
		_, err := relay.New(b.pool, b.ob, sink, relay.Config{})
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != "sink" || !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(%s) = %v, want an idemq.ErrConfig naming the sink", name, err)
		}
		r := relay.NewRouter()
		if err := r.Route("orders", sink); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("Router.Route(%s) = %v, want an idemq.ErrConfig", name, err)
		}
		if err := r.RoutePrefix("orders.", sink); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("Router.RoutePrefix(%s) = %v, want an idemq.ErrConfig", name, err)
		}
		if s := r.Lookup("orders"); s != nil {
			t.Errorf("a refused %s route was kept", name)
		}
	}
	r := relay.NewRouter()
	for _, err := range []error{r.Route("", &recorder{}), router.Route("orders", &recorder{}), router.RoutePrefix("orders.", &recorder{})} {
		if !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("Route with an empty destination or on a nil *Router = %v, want an idemq.ErrConfig", err)
		}
	}
	if err := r.Route("orders", &recorder{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Route("orders", &recorder{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("a destination routed twice: %v, want an idemq.ErrConfig", err)
	}
}

// TestBadInputSizesAboveTheMaximumAreRefused: a BatchSize of 1<<31 made
// the first scan allocate its window and die of out of memory; every size,
// count and timeout with a documented maximum is refused above it, naming
// the field, and its maximum itself is accepted. A PublishTimeout of a
// nanosecond, which timed out every batch, is refused below its minimum.
func TestBadInputSizesAboveTheMaximumAreRefused(t *testing.T) {
	b := setup(t)
	for _, c := range []struct {
		field    string
		bad, top relay.Config
	}{
		{"BatchSize", relay.Config{BatchSize: 1 << 31}, relay.Config{BatchSize: relay.BatchSizeMax}},
		{"BatchSize", relay.Config{BatchSize: relay.BatchSizeMax + 1}, relay.Config{BatchSize: relay.BatchSizeMax}},
		{"Workers", relay.Config{Workers: relay.WorkersMax + 1}, relay.Config{Workers: relay.WorkersMax}},
		{"PublishTimeout", relay.Config{PublishTimeout: relay.PublishTimeoutMax + 1}, relay.Config{PublishTimeout: relay.PublishTimeoutMax}},
		{"PublishTimeout", relay.Config{PublishTimeout: time.Nanosecond}, relay.Config{PublishTimeout: relay.PublishTimeoutMin}},
		{"PublishTimeout", relay.Config{PublishTimeout: relay.PublishTimeoutMin - 1}, relay.Config{PublishTimeout: relay.PublishTimeoutMin}},
		{"LeaseTTL", relay.Config{LeaseTTL: relay.LeaseTTLMax + 1}, relay.Config{LeaseTTL: relay.LeaseTTLMax}},
	} {
		_, err := relay.New(b.pool, b.ob, &recorder{}, c.bad)
		if ce, ok := errors.AsType[*idemq.ConfigError](err); !ok || ce.Field != c.field || !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(%+v) = %v, want a ConfigError for %s", c.bad, err, c.field)
		}
		if _, err := relay.New(b.pool, b.ob, &recorder{}, c.top); err != nil {
			t.Errorf("New(%+v) = %v, want it accepted", c.top, err)
		}
	}
}
