package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
)

func TestKeepAliveRenewsUntilStopped(t *testing.T) {
	var n atomic.Int32
	stop := KeepAlive(context.Background(), time.Millisecond, func(context.Context) error {
		n.Add(1)
		return errors.New("store unreachable") // not a loss: the next tick tries again
	})
	for n.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("stop = %v, want nil: nothing was lost", err)
	}
	after := n.Load()
	time.Sleep(5 * time.Millisecond)
	if n.Load() != after {
		t.Fatalf("renewed after stop")
	}
	if err := stop(); err != nil {
		t.Fatalf("second stop = %v", err)
	}
}

func TestKeepAliveStopsOnLoss(t *testing.T) {
	var n atomic.Int32
	lost := fmt.Errorf("extend: %w", idemq.ErrLeaseLost)
	stop := KeepAlive(context.Background(), time.Millisecond, func(context.Context) error {
		if n.Add(1) == 2 {
			return lost
		}
		return nil
	})
	for n.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond)
	if got := n.Load(); got != 2 {
		t.Fatalf("%d renewals, want none after the loss", got)
	}
	if err := stop(); err != lost {
		t.Fatalf("stop = %v, want the loss %v", err, lost)
	}
}

func TestKeepAliveBoundsARenewal(t *testing.T) {
	bounded := make(chan error, 1)
	stop := KeepAlive(context.Background(), 2*time.Millisecond, func(ctx context.Context) error {
		<-ctx.Done() // hangs until its own deadline
		select {
		case bounded <- ctx.Err():
		default:
		}
		return ctx.Err()
	})
	defer stop()
	select {
	case err := <-bounded:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("renewal ended with %v, want its deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a hanging renewal was never cut off")
	}
}

func TestKeepAliveEndsWithCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := KeepAlive(ctx, time.Hour, func(context.Context) error { return nil })
	cancel()
	if err := stop(); err != nil {
		t.Fatalf("stop = %v", err)
	}
}
