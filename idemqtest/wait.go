package idemqtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// DefaultTimeout is how long [WaitFor] and [WaitForNoError] poll before
// they fail the test, unless [Within] says otherwise. It guards against a
// hang, so it is generous: a loaded CI machine must never trip it.
const DefaultTimeout = 2 * time.Minute

// deadlineMargin is how long before the test binary's own deadline (go test
// -timeout) a wait gives up, so that the test fails with what it waited for
// instead of the binary panicking with every goroutine's stack.
const deadlineMargin = 5 * time.Second

// A WaitOption changes how [WaitFor] and [WaitForNoError] wait.
type WaitOption func(*waiter)

type waiter struct {
	timeout time.Duration
	ctx     context.Context
	state   func() string
}

// Within sets how long to poll before failing (default [DefaultTimeout]).
func Within(d time.Duration) WaitOption { return func(w *waiter) { w.timeout = d } }

// Until gives up as soon as ctx is done, too: a test's context that
// expires is as final as the timeout.
func Until(ctx context.Context) WaitOption { return func(w *waiter) { w.ctx = ctx } }

// Explain adds state() to the failure message, for what the test knows
// that the condition does not say (outcomes so far, rows pending).
func Explain(state func() string) WaitOption { return func(w *waiter) { w.state = state } }

// WaitFor polls cond until it returns true. When it does not within the
// timeout, it fails tb with "gave up waiting for <what>" (and the
// [Explain] state). It polls every few milliseconds at first and backs off
// to 50ms, so a condition that queries Postgres costs little.
//
// Like tb.Fatal, it must be called from the goroutine running the test.
func WaitFor(tb testing.TB, what string, cond func() bool, opts ...WaitOption) {
	tb.Helper()
	wait(tb, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}, opts)
}

// WaitForNoError is [WaitFor] for a condition that says why it does not
// hold yet: it polls cond until it returns nil and reports its last error
// when it gives up. It suits waits for an outside process (a server that
// answers, a command that succeeds).
func WaitForNoError(tb testing.TB, what string, cond func() error, opts ...WaitOption) {
	tb.Helper()
	wait(tb, what, cond, opts)
}

var errNotYet = errors.New("the condition is still false")

func wait(tb testing.TB, what string, cond func() error, opts []WaitOption) {
	tb.Helper()
	w := waiter{timeout: DefaultTimeout, ctx: context.Background()}
	for _, o := range opts {
		o(&w)
	}
	start := time.Now()
	deadline := start.Add(w.timeout)
	if d, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := d.Deadline(); ok && end.Add(-deadlineMargin).Before(deadline) {
			deadline = end.Add(-deadlineMargin)
		}
	}
	pause := 2 * time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || w.ctx.Err() != nil {
			msg := fmt.Sprintf("gave up waiting for %s after %v", what, time.Since(start).Round(time.Millisecond))
			if w.ctx.Err() != nil {
				msg += fmt.Sprintf(" (context done: %v)", context.Cause(w.ctx))
			}
			if err != errNotYet {
				msg += ": " + err.Error()
			}
			if w.state != nil {
				msg += "; " + w.state()
			}
			tb.Fatal(msg)
			return
		}
		time.Sleep(pause)
		if pause < 50*time.Millisecond {
			pause = pause * 3 / 2
		}
	}
}
