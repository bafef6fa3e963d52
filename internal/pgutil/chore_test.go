package pgutil_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/testenv"
)

// TestChoreRunsInOneProcessAtATime: while one run of a chore holds its
// lock, another run of the same name on the same database does nothing
// and returns 0; a chore of another name runs; once the first returns,
// the next run works again.
func TestChoreRunsInOneProcessAtATime(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	entered, release := make(chan struct{}), make(chan struct{})
	first := pgutil.Chore(pool, "inbox gc t", time.Minute, func(context.Context) (int64, error) {
		close(entered)
		<-release
		return 1, nil
	})
	ran := 0
	second := pgutil.Chore(pool, "inbox gc t", time.Minute, func(context.Context) (int64, error) { ran++; return 1, nil })
	other := pgutil.Chore(pool, "inbox classify t", time.Minute, func(context.Context) (int64, error) { return 1, nil })

	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := first.Run(ctx)
		done <- result{n, err}
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first run never started")
	}
	if n, err := second.Run(ctx); err != nil || n != 0 || ran != 0 {
		t.Fatalf("a second run while the first holds the lock: %d, %v (ran %d times); want 0 and not run", n, err, ran)
	}
	if n, err := other.Run(ctx); err != nil || n != 1 {
		t.Fatalf("a chore of another name: %d, %v; want it run", n, err)
	}
	close(release)
	select {
	case r := <-done:
		if r.err != nil || r.n != 1 {
			t.Fatalf("the first run: %d, %v", r.n, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first run never returned")
	}
	if n, err := second.Run(ctx); err != nil || n != 1 || ran != 1 {
		t.Fatalf("a run after the first ended: %d, %v (ran %d times); want it run", n, err, ran)
	}
}
