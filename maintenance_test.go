package idemq_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
)

// quiet is a logger that drops everything.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestMaintenanceRunsEachChoreOnItsInterval: every chore runs at once,
// then again and again; a failing chore is retried at its next interval
// without stopping the others or the service; a second concurrent Run is
// refused; Stop ends it.
func TestMaintenanceRunsEachChoreOnItsInterval(t *testing.T) {
	t.Parallel()
	var ok, failing atomic.Int64
	m, err := idemq.NewMaintenance(quiet,
		idemq.Chore{Name: "ok", Every: time.Millisecond, Run: func(context.Context) (int64, error) { return ok.Add(1), nil }},
		idemq.Chore{Name: "failing", Every: time.Millisecond, Run: func(context.Context) (int64, error) {
			failing.Add(1)
			return 0, errors.New("database away")
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	running, err := idemq.Start(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(ctx); !errors.Is(err, idemq.ErrRunning) {
		t.Fatalf("a second Run: %v, want ErrRunning", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ok.Load() < 3 || failing.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: ok ran %d times, failing %d; want 3 each", ok.Load(), failing.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := running.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

// TestMaintenanceRunOnceRunsEveryChoreAndJoinsTheErrors is the single
// pass of idemq gc: every chore runs once, a failure does not stop the
// rest, and the error names the chore.
func TestMaintenanceRunOnceRunsEveryChoreAndJoinsTheErrors(t *testing.T) {
	t.Parallel()
	m, err := idemq.NewMaintenance(quiet,
		idemq.Chore{Name: "broken", Every: time.Hour, Run: func(context.Context) (int64, error) { return 0, errors.New("no table") }},
		idemq.Chore{Name: "gc", Every: time.Hour, Run: func(context.Context) (int64, error) { return 7, nil }},
	)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.RunOnce(context.Background())
	if err == nil || !strings.Contains(err.Error(), "broken: no table") {
		t.Fatalf("RunOnce error %v, want the broken chore's", err)
	}
	if len(res) != 2 || res[0].Err == nil || res[1].Name != "gc" || res[1].Done != 7 || res[1].Err != nil {
		t.Fatalf("RunOnce results %+v", res)
	}
}

// TestNewMaintenanceRefusesBadChores: an empty or repeated name, a
// non-positive interval and a nil Run are ConfigErrors on the field.
func TestNewMaintenanceRefusesBadChores(t *testing.T) {
	t.Parallel()
	run := func(context.Context) (int64, error) { return 0, nil }
	for field, chores := range map[string][]idemq.Chore{
		"chores[0].Name":  {{Every: time.Second, Run: run}},
		"chores[1].Name":  {{Name: "a", Every: time.Second, Run: run}, {Name: "a", Every: time.Second, Run: run}},
		"chores[0].Every": {{Name: "a", Run: run}},
		"chores[0].Run":   {{Name: "a", Every: time.Second}},
	} {
		var ce *idemq.ConfigError
		if _, err := idemq.NewMaintenance(nil, chores...); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: %v, want a ConfigError on it", field, err)
		}
	}
}
