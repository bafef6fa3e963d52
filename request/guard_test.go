package request_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

func redisStore(t *testing.T) request.Store {
	rdb, prefix := testenv.Redis(t)
	s, err := redisstore.New(context.Background(), rdb, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func guard(t *testing.T, s request.Store, cfg request.Config) *request.Guard {
	g, err := request.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

var fp = request.Fingerprint([]byte("POST"), []byte("/orders"), []byte("{}"))

func newID() request.ID { return request.ID{Scope: "t1", Key: uuid.NewString()} }

func mustRun(t *testing.T, g *request.Guard, ctx context.Context, id request.ID) *request.Attempt {
	t.Helper()
	d, err := g.Begin(ctx, id, fp)
	if err != nil || d.Run == nil {
		t.Fatalf("Begin = %+v, %v; want an attempt", d, err)
	}
	return d.Run
}

func TestGuardRunsOnceAndReplays(t *testing.T) {
	t.Parallel()
	g := guard(t, redisStore(t), request.Config{})
	id := newID()
	a := mustRun(t, g, context.Background(), id)
	var inFlight *request.InFlightError
	if _, err := g.Begin(context.Background(), id, fp); !errors.As(err, &inFlight) || inFlight.RetryAfter() > time.Second {
		t.Fatalf("second Begin: %v, want an *InFlightError suggesting at most a second", err)
	}
	if err := a.Complete(request.Response{Status: 201, Body: []byte("done")}); err != nil {
		t.Fatal(err)
	}
	d, err := g.Begin(context.Background(), id, fp)
	if err != nil || d.Replay == nil || string(d.Replay.Response.Body) != "done" {
		t.Fatalf("Begin after Complete = %+v, %v; want the replay", d, err)
	}
	var conflict *request.ConflictError
	if _, err := g.Begin(context.Background(), id, request.Fingerprint([]byte("other"))); !errors.As(err, &conflict) {
		t.Fatalf("Begin with another fingerprint: %v, want *ConflictError", err)
	}
}

func TestGuardWaitsForInFlight(t *testing.T) {
	t.Parallel()
	g := guard(t, redisStore(t), request.Config{Wait: time.Minute})
	id := newID()
	a := mustRun(t, g, context.Background(), id)
	type begun struct {
		d   request.Decision
		err error
	}
	done := make(chan begun, 1)
	go func() {
		d, err := g.Begin(context.Background(), id, fp)
		done <- begun{d, err}
	}()
	time.Sleep(50 * time.Millisecond)
	if err := a.Complete(request.Response{Status: 200, Body: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	if b := requesttest.Recv(t, done, "the waiting Begin"); b.err != nil || b.d.Replay == nil || string(b.d.Replay.Response.Body) != "first" {
		t.Fatalf("waiting Begin = %+v, %v; want the replay", b.d, b.err)
	}
	// A waiter whose context ends first reports the key in flight.
	id2 := newID()
	defer mustRun(t, g, context.Background(), id2).Release()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var inFlight *request.InFlightError
	if _, err := g.Begin(ctx, id2, fp); !errors.As(err, &inFlight) {
		t.Fatalf("Begin whose context ended while waiting: %v, want *InFlightError", err)
	}
}

// TestGuardRenewsTheLease: an attempt that runs longer than its lease
// keeps the key, because the Guard renews it.
func TestGuardRenewsTheLease(t *testing.T) {
	t.Parallel()
	g := guard(t, redisStore(t), request.Config{Lease: time.Second})
	id := newID()
	a := mustRun(t, g, context.Background(), id)
	time.Sleep(2500 * time.Millisecond)
	var inFlight *request.InFlightError
	if _, err := g.Begin(context.Background(), id, fp); !errors.As(err, &inFlight) {
		t.Fatalf("Begin during a long attempt: %v, want *InFlightError", err)
	}
	if err := a.Complete(request.Response{Status: 200}); err != nil {
		t.Fatalf("Complete after a renewed lease: %v", err)
	}
}

// stuckExtend is a store whose Extend does nothing while stuck is set, as
// when a holder's renewals do not get through.
type stuckExtend struct {
	request.Store
	stuck atomic.Bool
}

func (s *stuckExtend) Extend(ctx context.Context, l idemq.Lease, d time.Duration) (idemq.Lease, error) {
	if s.stuck.Load() {
		return l, nil
	}
	return s.Store.Extend(ctx, l, d)
}

// TestGuardLostLeaseCancelsTheAttempt: when a renewal finds the key taken
// over, the attempt's context is cancelled with ErrLeaseLost and its
// Complete is refused; the successor's response stands.
func TestGuardLostLeaseCancelsTheAttempt(t *testing.T) {
	t.Parallel()
	s := &stuckExtend{Store: redisStore(t)}
	s.stuck.Store(true)
	g := guard(t, s, request.Config{Lease: 300 * time.Millisecond})
	id := newID()
	first := mustRun(t, g, context.Background(), id)
	time.Sleep(400 * time.Millisecond)
	second := mustRun(t, g, context.Background(), id)
	s.stuck.Store(false)
	select {
	case <-first.Context().Done():
	case <-time.After(requesttest.WaitTimeout):
		t.Fatal("gave up waiting for the first attempt to learn it lost its lease")
	}
	if cause := context.Cause(first.Context()); !errors.Is(cause, idemq.ErrLeaseLost) {
		t.Fatalf("first attempt's context cause = %v, want ErrLeaseLost", cause)
	}
	if err := second.Complete(request.Response{Status: 201, Body: []byte("second")}); err != nil {
		t.Fatal(err)
	}
	if err := first.Complete(request.Response{Status: 201, Body: []byte("first")}); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("first Complete = %v, want ErrLeaseLost", err)
	}
	rec, err := g.Get(context.Background(), id)
	if err != nil || string(rec.Response.Body) != "second" {
		t.Fatalf("record = %+v, %v; want the second response", rec, err)
	}
}

// TestGuardReleaseRunsAgain: a released key runs the next attempt.
func TestGuardReleaseRunsAgain(t *testing.T) {
	t.Parallel()
	g := guard(t, redisStore(t), request.Config{})
	id := newID()
	a := mustRun(t, g, context.Background(), id)
	if err := a.Release(); err != nil {
		t.Fatal(err)
	}
	b := mustRun(t, g, context.Background(), id)
	if b.Lease().Token <= a.Lease().Token {
		t.Fatalf("token %d after %d", b.Lease().Token, a.Lease().Token)
	}
	if err := a.Release(); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("second Release of a finished attempt: %v, want ErrLeaseLost", err)
	}
}

// TestGuardFailsClosed: a store that cannot be reached is ErrUnavailable
// within StoreTimeout, never an attempt.
func TestGuardFailsClosed(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	s, err := redisstore.New(context.Background(), srv.Client(), redisstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	g := guard(t, s, request.Config{StoreTimeout: time.Second})
	srv.Stop()
	if d, err := g.Begin(context.Background(), newID(), fp); !errors.Is(err, request.ErrUnavailable) || d.Run != nil {
		t.Fatalf("Begin on a stopped store = %+v, %v; want ErrUnavailable", d, err)
	}
	srv.Start()
	mustRun(t, g, context.Background(), newID())
}

func TestGuardRejectsBadInput(t *testing.T) {
	t.Parallel()
	g := guard(t, redisStore(t), request.Config{})
	for _, id := range []request.ID{
		{Key: ""},
		{Key: strings.Repeat("k", 256)},
		{Key: "tab\there"},
		{Key: "ünïcode"},
	} {
		if _, err := g.Begin(context.Background(), id, fp); !errors.Is(err, request.ErrInvalidKey) {
			t.Fatalf("Begin(%q, %q) = %v, want ErrInvalidKey", id.Scope, id.Key, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	s := request.Store(nil)
	if _, err := request.New(s, request.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("nil store: %v", err)
	}
	rs := &stuckExtend{}
	for _, cfg := range []request.Config{
		{Lease: -time.Second},
		{Lease: time.Millisecond},
		{Wait: -1},
		{StoreTimeout: -1},
		{Retry: idemq.Retry{BaseDelay: -1}},
		{Keys: request.KeyRules{MaxLen: -1}},
		{Keys: request.KeyRules{MaxLen: 2000}},
		{Keys: request.KeyRules{Format: 9}},
	} {
		var ce *idemq.ConfigError
		if _, err := request.New(rs, cfg); !errors.As(err, &ce) {
			t.Fatalf("config %+v: %v, want a *ConfigError", cfg, err)
		}
	}
}
