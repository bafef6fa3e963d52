package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDelayIsFullJitterUnderTheCeiling(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Cap: time.Second}
	for attempt, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 30: time.Second} {
		var low, high bool
		for range 2000 {
			d := p.Delay(attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", attempt, d, ceiling)
			}
			low = low || d < ceiling/4
			high = high || d > ceiling*3/4
		}
		if !low || !high {
			t.Fatalf("attempt %d: delays do not spread over [0, %v] (low %v, high %v)", attempt, ceiling, low, high)
		}
	}
}

func TestNewBackOffGrowsAndCaps(t *testing.T) {
	b := Policy{Base: 10 * time.Millisecond, Cap: 80 * time.Millisecond}.NewBackOff(0)
	for i := range 50 {
		if d := b.NextBackOff(); d < 0 || d > 80*time.Millisecond {
			t.Fatalf("retry %d: %v outside [0, cap]", i, d)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a cancelled context = %v, want context.Canceled", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep = %v", err)
	}
}
