package relay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/internal/outboxsql"
)

// ErrNoRoute is matched by the error a [Router] reports for a message
// whose destination has no sink. That error also matches [ErrSkipped] and
// carries an idemq.RetryAfter hint of [NoRouteHold]: the relay holds the
// message (and its key's followers) without counting an attempt, reports
// it ([Hooks.OnHeld], the log, outbox.Stats.Unrouted) and tries it again
// later. A missing route is a deployment mistake, fixed by deploying the
// route, not a reason to dead-letter the message.
var ErrNoRoute = errors.New(outboxsql.NoRoute)

// NoRouteHold is how long a message whose destination no route matches
// waits before the relay tries it again. After a new route is deployed,
// outbox.Outbox.RetryNow sends such messages at once.
const NoRouteHold = 30 * time.Second

// noRouteError is the hold of a message whose destination has no sink.
type noRouteError struct{ destination string }

func (e *noRouteError) Error() string { return fmt.Sprintf("%s %q", outboxsql.NoRoute, e.destination) }

// Is matches ErrNoRoute and ErrSkipped: the message was not attempted.
func (e *noRouteError) Is(target error) bool { return target == ErrNoRoute || target == ErrSkipped }

// Router is a [Sink] that hands each message to the sink routed for its
// destination: an exact route wins, then the longest matching prefix. A
// message whose destination has no route is held ([ErrNoRoute]): it stays
// in the outbox, reported, and is tried again every [NoRouteHold].
//
// Per-key order holds across sinks: when the messages of one key in a batch
// go to several destinations, the router publishes them in [Rounds], each
// round after the previous one finished, and skips ([ErrSkipped]) the rest
// of a key once one of its messages failed. Different destinations of one
// round are published concurrently. A routed sink that panics fails its
// part of the batch with [ErrSinkPanicked].
//
// The zero Router has no routes and is ready to use; a nil *Router routes
// nothing. Configure the routes before the relay runs; Publish may then be
// called concurrently.
type Router struct {
	exact    map[string]Sink
	prefixes []prefixRoute // longest first
}

type prefixRoute struct {
	prefix string
	sink   Sink
}

// NewRouter returns a router without routes.
func NewRouter() *Router { return &Router{} }

// Route sends messages whose destination is exactly destination to sink.
func (r *Router) Route(destination string, sink Sink) error {
	switch {
	case r == nil:
		return idemq.NewConfigError("relay.Router", "router", "is nil: make one with NewRouter")
	case destination == "":
		return idemq.NewConfigError("relay.Router", "destination", "is empty")
	case nilcheck.IsNil(sink):
		return idemq.NewConfigError("relay.Router", "sink", "is nil (destination %q)", destination)
	}
	if _, ok := r.exact[destination]; ok {
		return idemq.NewConfigError("relay.Router", "destination", "%q routed twice", destination)
	}
	if r.exact == nil {
		r.exact = map[string]Sink{}
	}
	r.exact[destination] = sink
	return nil
}

// RoutePrefix sends messages whose destination starts with prefix to sink,
// unless an exact route or a longer prefix matches.
func (r *Router) RoutePrefix(prefix string, sink Sink) error {
	switch {
	case r == nil:
		return idemq.NewConfigError("relay.Router", "router", "is nil: make one with NewRouter")
	case nilcheck.IsNil(sink):
		return idemq.NewConfigError("relay.Router", "sink", "is nil (prefix %q)", prefix)
	}
	for _, p := range r.prefixes {
		if p.prefix == prefix {
			return idemq.NewConfigError("relay.Router", "prefix", "%q routed twice", prefix)
		}
	}
	r.prefixes = append(r.prefixes, prefixRoute{prefix, sink})
	sort.SliceStable(r.prefixes, func(i, j int) bool { return len(r.prefixes[i].prefix) > len(r.prefixes[j].prefix) })
	return nil
}

// Lookup returns the sink for destination, or nil.
func (r *Router) Lookup(destination string) Sink {
	if r == nil {
		return nil
	}
	if s, ok := r.exact[destination]; ok {
		return s
	}
	for _, p := range r.prefixes {
		if strings.HasPrefix(destination, p.prefix) {
			return p.sink
		}
	}
	return nil
}

// Publish implements [Sink].
func (r *Router) Publish(ctx context.Context, id BatchID, batch []Message) error {
	f := NewFailures(batch)
	for _, round := range Rounds(batch, func(m *Message) string { return m.Destination }) {
		type call struct {
			sink  Sink
			index []int // batch indexes of the call's messages
			err   error
		}
		var calls []*call
		byDest := map[string]*call{}
		for _, i := range round {
			if f.Skip(i) {
				continue
			}
			dest := batch[i].Destination
			c := byDest[dest]
			if c == nil {
				c = &call{sink: r.Lookup(dest)}
				byDest[dest] = c
				calls = append(calls, c)
			}
			if c.sink == nil {
				f.Fail(i, idemq.RetryAfter(&noRouteError{dest}, NoRouteHold))
				continue
			}
			c.index = append(c.index, i)
		}
		var wg sync.WaitGroup
		for _, c := range calls {
			if len(c.index) == 0 {
				continue
			}
			send := make([]Message, len(c.index))
			for j, i := range c.index {
				send[j] = batch[i]
			}
			wg.Go(func() { c.err = publish(ctx, c.sink, id, send) })
		}
		wg.Wait()
		for _, c := range calls {
			f.Merge(c.index, c.err)
		}
	}
	return f.Err(ctx)
}
