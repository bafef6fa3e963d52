package idemq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
)

func TestConfigErrorMatchesErrConfigAndNamesTheField(t *testing.T) {
	err := idemq.Retry{BaseDelay: time.Second, MaxDelay: time.Millisecond}.Validate("relay")
	var ce *idemq.ConfigError
	if !errors.Is(err, idemq.ErrConfig) || !errors.As(err, &ce) || ce.Field != "Retry.BaseDelay" || ce.Component != "relay" {
		t.Fatalf("Validate = %v, want a ConfigError for relay Retry.BaseDelay matching ErrConfig", err)
	}
	if err := (idemq.Retry{MaxAttempts: -1}).Validate("c"); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("negative MaxAttempts: %v", err)
	}
}

func TestRetryDefaultsAndFullJitter(t *testing.T) {
	r := idemq.Retry{MaxAttempts: 3}.WithDefaults(idemq.Retry{MaxAttempts: 9, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second})
	if r.MaxAttempts != 3 || r.BaseDelay != 100*time.Millisecond || r.MaxDelay != time.Second {
		t.Fatalf("WithDefaults = %+v", r)
	}
	for attempt, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 30: time.Second} {
		var low, high bool
		for range 2000 {
			d := r.Delay(attempt, 0)
			if d < 0 || d > ceiling {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", attempt, d, ceiling)
			}
			low, high = low || d < ceiling/4, high || d > ceiling*3/4
		}
		if !low || !high {
			t.Fatalf("attempt %d: delays do not spread over [0, %v]", attempt, ceiling)
		}
	}
	if d := r.Delay(1, time.Hour); d != time.Hour {
		t.Fatalf("Delay with a retry-after hint = %v, want the hint", d)
	}
}

// blocker is a minimal Service on lifecycle.State.
type blocker struct {
	lifecycle.State
	fail error
}

func (b *blocker) Run(ctx context.Context) error {
	ready, end, err := b.Begin()
	if err != nil {
		return err
	}
	defer end()
	if b.fail != nil {
		return b.fail
	}
	ready()
	<-ctx.Done()
	return nil
}

func TestStartWaitsForReadyAndStopWaitsForRun(t *testing.T) {
	b := &blocker{}
	for range 2 { // a service can be run again after it stopped
		r, err := idemq.Start(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Run(context.Background()); !errors.Is(err, idemq.ErrRunning) {
			t.Fatalf("second concurrent Run = %v, want ErrRunning", err)
		}
		if err := r.Stop(); err != nil {
			t.Fatalf("Stop = %v", err)
		}
		<-r.Done()
	}
	boom := errors.New("boom")
	if _, err := idemq.Start(context.Background(), &blocker{fail: boom}); !errors.Is(err, boom) {
		t.Fatalf("Start of a failing service = %v, want its error", err)
	}
}
