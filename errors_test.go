package idemq

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestErrorMarkersSurviveWrapping(t *testing.T) {
	base := errors.New("boom")
	err := fmt.Errorf("handler: %w", Permanent(base))
	if !IsPermanent(err) || !errors.Is(err, base) {
		t.Fatalf("IsPermanent(%v) = false or base lost", err)
	}
	if IsPermanent(base) {
		t.Fatal("plain error reported permanent")
	}
	err = fmt.Errorf("send: %w", RetryAfter(base, 3*time.Second))
	if d, ok := RetryAfterHint(err); !ok || d != 3*time.Second || !errors.Is(err, base) {
		t.Fatalf("RetryAfterHint = %v %v", d, ok)
	}
	if Permanent(nil) != nil || RetryAfter(nil, time.Second) != nil {
		t.Fatal("markers on nil must stay nil")
	}
}
