package relay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/idemq/idemq"
)

// ErrNoRoute is matched by the (permanent) error a [Router] reports for a
// message whose destination has no sink.
var ErrNoRoute = errors.New("relay: no sink for destination")

// Router is a [Sink] that hands each message to the sink routed for its
// destination: an exact route wins, then the longest matching prefix. A
// destination with no route fails permanently with [ErrNoRoute], so the
// message becomes a dead letter instead of blocking the relay.
//
// Per-key order holds across sinks: when the messages of one key in a batch
// go to several destinations, the router publishes them in rounds, each
// round after the previous one finished, and skips ([ErrSkipped]) the rest
// of a key once one of its messages failed. Different destinations of one
// round are published concurrently.
//
// Configure the routes before the relay runs; Publish may then be called
// concurrently.
type Router struct {
	exact    map[string]Sink
	prefixes []prefixRoute // longest first
}

type prefixRoute struct {
	prefix string
	sink   Sink
}

// NewRouter returns a router without routes.
func NewRouter() *Router { return &Router{exact: map[string]Sink{}} }

// Route sends messages whose destination is exactly destination to sink.
func (r *Router) Route(destination string, sink Sink) error {
	if destination == "" || sink == nil {
		return errors.New("relay: Route needs a destination and a sink")
	}
	if _, ok := r.exact[destination]; ok {
		return fmt.Errorf("relay: destination %q routed twice", destination)
	}
	r.exact[destination] = sink
	return nil
}

// RoutePrefix sends messages whose destination starts with prefix to sink,
// unless an exact route or a longer prefix matches.
func (r *Router) RoutePrefix(prefix string, sink Sink) error {
	if sink == nil {
		return errors.New("relay: RoutePrefix needs a sink")
	}
	for _, p := range r.prefixes {
		if p.prefix == prefix {
			return fmt.Errorf("relay: prefix %q routed twice", prefix)
		}
	}
	r.prefixes = append(r.prefixes, prefixRoute{prefix, sink})
	sort.SliceStable(r.prefixes, func(i, j int) bool { return len(r.prefixes[i].prefix) > len(r.prefixes[j].prefix) })
	return nil
}

// Lookup returns the sink for destination, or nil.
func (r *Router) Lookup(destination string) Sink {
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
func (r *Router) Publish(ctx context.Context, batch []Message) error {
	type keyState struct {
		dest  string
		round int
	}
	type group struct {
		sink Sink
		idx  []int
	}
	// Assign rounds: a key's messages move to the next round whenever its
	// destination changes.
	keys := map[string]*keyState{}
	var rounds []map[string]*group
	failed := map[int]error{}
	for i, m := range batch {
		round := 0
		if m.Key != "" {
			st := keys[m.Key]
			if st == nil {
				st = &keyState{dest: m.Destination}
				keys[m.Key] = st
			} else if st.dest != m.Destination {
				st.dest = m.Destination
				st.round++
			}
			round = st.round
		}
		for len(rounds) <= round {
			rounds = append(rounds, map[string]*group{})
		}
		g := rounds[round][m.Destination]
		if g == nil {
			g = &group{sink: r.Lookup(m.Destination)}
			rounds[round][m.Destination] = g
		}
		g.idx = append(g.idx, i)
	}
	failedKeys := map[string]bool{}
	for _, round := range rounds {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for dest, g := range round {
			var send []Message
			var sendIdx []int
			for _, i := range g.idx {
				m := batch[i]
				switch {
				case m.Key != "" && failedKeys[m.Key]:
					failed[i] = ErrSkipped
				case g.sink == nil:
					failed[i] = idemq.Permanent(fmt.Errorf("%w %q", ErrNoRoute, dest))
				default:
					send = append(send, m)
					sendIdx = append(sendIdx, i)
				}
			}
			if len(send) == 0 {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := g.sink.Publish(ctx, send)
				if err == nil {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				var pe *PublishError
				if errors.As(err, &pe) {
					for j, e := range pe.Failed {
						if j >= 0 && j < len(sendIdx) {
							failed[sendIdx[j]] = e
						}
					}
					return
				}
				for _, i := range sendIdx {
					failed[i] = err
				}
			}()
		}
		wg.Wait()
		for i := range failed {
			if k := batch[i].Key; k != "" {
				failedKeys[k] = true
			}
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &PublishError{Failed: failed}
}
