package transporttest

import (
	"context"
	"errors"
	"testing"

	"github.com/idemq/idemq"
)

// RunTwice checks the idemq.Service lifecycle of a subscriber: it starts s
// (which returns once s is Ready), checks that a concurrent Run returns
// idemq.ErrRunning, calls round while s runs, and stops it; then all of it
// again on the same s, since a Run after a Run must work. round publishes
// and waits for what it expects the running subscriber to apply.
func RunTwice(t *testing.T, s idemq.Service, round func(i int)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for i := range 2 {
		running, err := idemq.Start(ctx, s)
		if err != nil {
			t.Fatalf("run %d: Start: %v", i, err)
		}
		if err := s.Run(ctx); !errors.Is(err, idemq.ErrRunning) {
			t.Errorf("run %d: a second concurrent Run returned %v, want idemq.ErrRunning", i, err)
		}
		round(i)
		if err := running.Stop(); err != nil {
			t.Fatalf("run %d: Stop: %v", i, err)
		}
	}
}
