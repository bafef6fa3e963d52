package idemq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/idemq/idemq"
)

func TestRetryBackOff(t *testing.T) {
	r := idemq.Retry{MaxAttempts: 4, BaseDelay: 10 * time.Millisecond, MaxDelay: 40 * time.Millisecond}
	b := r.BackOff()
	for n := 1; n < r.MaxAttempts; n++ {
		ceiling := min(r.BaseDelay<<(n-1), r.MaxDelay)
		if d := b.NextBackOff(); d < 0 || d > ceiling {
			t.Fatalf("retry %d: %v, want full jitter in [0, %v]", n, d, ceiling)
		}
	}
	if d := b.NextBackOff(); d != backoff.Stop {
		t.Fatalf("after %d failed attempts: %v, want Stop", r.MaxAttempts, d)
	}
	b.Reset()
	b.Hint(time.Second)
	if d := b.NextBackOff(); d != time.Second {
		t.Fatalf("hinted retry after Reset: %v, want the hint 1s", d)
	}
	if d := b.NextBackOff(); d > r.BaseDelay*2 {
		t.Fatalf("the hint outlived its retry: %v", d)
	}

	elapsed := idemq.Retry{BaseDelay: time.Hour, MaxDelay: time.Hour, MaxElapsed: time.Minute}.BackOff()
	elapsed.Hint(2 * time.Minute)
	if d := elapsed.NextBackOff(); d != backoff.Stop {
		t.Fatalf("a delay past MaxElapsed: %v, want Stop", d)
	}

	unbounded := idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}.BackOff()
	for range 100 {
		if d := unbounded.NextBackOff(); d == backoff.Stop {
			t.Fatal("a Retry without MaxAttempts and MaxElapsed stopped")
		}
	}
}

func TestRetryBackOffDrivesRetryNotify(t *testing.T) {
	r := idemq.Retry{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}
	calls, notified := 0, 0
	err := backoff.RetryNotify(func() error {
		calls++
		return errors.New("unavailable")
	}, backoff.WithContext(r.BackOff(), context.Background()), func(error, time.Duration) { notified++ })
	if err == nil || calls != r.MaxAttempts || notified != r.MaxAttempts-1 {
		t.Fatalf("err %v after %d calls and %d notifications; want an error after %d calls", err, calls, notified, r.MaxAttempts)
	}
}

// A Retry drives a backoff.RetryNotify loop with idemq's full jitter: here
// an operation that fails twice, then succeeds.
func ExampleRetry_BackOff() {
	r := idemq.Retry{MaxAttempts: 5, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond}
	ctx := context.Background()
	attempts := 0
	err := backoff.RetryNotify(func() error {
		attempts++
		if attempts < 3 {
			return errors.New("broker unavailable")
		}
		return nil
	}, backoff.WithContext(r.BackOff(), ctx), func(err error, d time.Duration) {
		fmt.Println("retrying after:", err)
	})
	fmt.Println(attempts, err)
	// Output:
	// retrying after: broker unavailable
	// retrying after: broker unavailable
	// 3 <nil>
}
