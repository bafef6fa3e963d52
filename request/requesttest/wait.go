package requesttest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// WaitTimeout bounds every wait of the front ends' tests: for a reply, for
// a handler to start, for a gate to open. It guards against a hang, so it
// is generous: a loaded machine must never reach it.
const WaitTimeout = 2 * time.Minute

// Recv returns the next value sent on ch, or fails tb with what it waited
// for when none comes within WaitTimeout. Like tb.Fatal, call it from the
// goroutine running the test.
func Recv[T any](tb testing.TB, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(WaitTimeout):
		tb.Fatalf("gave up waiting for %s after %v", what, WaitTimeout)
		panic("unreachable")
	}
}

// Gate holds a test's handlers until the test opens it. It also opens when
// the test ends, failed or not, and after WaitTimeout: a handler parked on
// a gate never keeps its server's Close (a cleanup) waiting forever.
type Gate struct {
	ctx  context.Context
	once sync.Once
	ch   chan struct{}
}

// NewGate returns a closed gate that opens at the end of tb.
func NewGate(tb testing.TB) *Gate {
	return &Gate{ctx: tb.Context(), ch: make(chan struct{})}
}

// Open lets every waiting and later handler through. It may be called
// more than once, from any goroutine.
func (g *Gate) Open() { g.once.Do(func() { close(g.ch) }) }

// Wait returns once the gate is open, the test ended or WaitTimeout passed;
// it ignores the caller's context, as stuck code does.
func (g *Gate) Wait() {
	select {
	case <-g.ch:
	case <-g.ctx.Done():
	case <-time.After(WaitTimeout):
	}
}
