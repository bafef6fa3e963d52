// Package lifecycle implements the run state behind idemq.Service, and the
// shutdown budget every component gives its in-flight work.
package lifecycle

import (
	"context"
	"sync"
	"time"

	"github.com/idemq/idemq"
)

// State is embedded (as a value) in a component to give it Ready and the
// one-Run-at-a-time rule.
type State struct {
	mu      sync.Mutex
	running bool
	ready   chan struct{}
	closed  bool
}

// Begin marks the start of a Run. It returns idemq.ErrRunning if a Run is
// active. Call ready once the component takes work, and end when Run
// returns.
func (s *State) Begin() (ready, end func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil, nil, idemq.ErrRunning
	}
	s.running = true
	if s.ready == nil || s.closed {
		s.ready, s.closed = make(chan struct{}), false
	}
	ch := s.ready
	var once sync.Once
	ready = func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.ready == ch && !s.closed {
				close(ch)
				s.closed = true
			}
		})
	}
	end = func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.running = false
	}
	return ready, end, nil
}

// Ready returns the channel closed when the current or next Run is ready.
func (s *State) Ready() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready == nil || (s.closed && !s.running) {
		// The last run is over: hand out the next run's channel.
		s.ready, s.closed = make(chan struct{}), false
	}
	return s.ready
}

// Grace returns a context for in-flight work that outlives ctx by grace:
// it is cancelled grace after ctx is done (or by the returned cancel).
func Grace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(grace, cancel)
		context.AfterFunc(work, func() { t.Stop() })
	})
	return work, func() { stop(); cancel() }
}

// Sleep waits d or until ctx is done, whichever comes first, and returns
// ctx.Err() in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
