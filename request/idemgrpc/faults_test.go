package idemgrpc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/requesttest"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// With the store down the handler never runs unprotected: calls fail with
// UNAVAILABLE, and service resumes when the store is back.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	for _, kind := range requesttest.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			st, server := kind.Outage(t)
			storeOutage(t, st, server, kind.Durable)
		})
	}
}

func storeOutage(t *testing.T, st request.Store, server requesttest.Switchable, durable bool) {
	h := &counter{}
	addr := serve(t, &ledger{charge: h.charge},
		grpcgo.UnaryInterceptor(serverInterceptor(t, st, request.Config{StoreTimeout: 2 * time.Second}, ServerConfig{})))
	once := dial(t, addr)
	req := &testpb.ChargeRequest{Account: "a", Amount: 3}
	first, _, err := call(t.Context(), once, "before", req)
	if err != nil {
		t.Fatal(err)
	}

	server.Stop()
	for _, key := range []string{"during", "before"} {
		_, _, err := call(t.Context(), once, key, req)
		wantError(t, err, codes.Unavailable, ReasonStoreUnavailable)
	}
	if h.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", h.runs.Load())
	}

	server.Start()
	// A pool may hand out a connection the outage cut: a client that
	// retries UNAVAILABLE gets through.
	retrying := dial(t, addr, grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{
		Retry: idemq.Retry{MaxAttempts: 10, BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond},
	})))
	resp, replayed, err := call(t.Context(), retrying, "during", req)
	if err != nil || replayed || resp.ChargeId != "ch-2" {
		t.Fatalf("after the outage: %v, replayed %v, %v", resp, replayed, err)
	}
	if !durable {
		return // the records went with the server
	}
	again, replayed, err := call(t.Context(), retrying, "before", req)
	if err != nil || !replayed || !proto.Equal(again, first) {
		t.Fatalf("replay after the outage: %v, replayed %v, %v; want %v", again, replayed, err, first)
	}
}

// stalled wraps a real store; while paused, lease renewals fail as they
// do for a process that stalls past its lease (a long GC pause, a
// partition from the store).
type stalled struct {
	request.Store
	paused atomic.Bool
}

func (s *stalled) Extend(ctx context.Context, lease idemq.Lease, d time.Duration) (idemq.Lease, error) {
	if s.paused.Load() {
		return lease, errors.New("stalled")
	}
	return s.Store.Extend(ctx, lease, d)
}

// A holder that stalls past its lease loses the key to the next call; its
// late outcome is refused by the fence, and its client gets the
// successor's response.
func TestStalledHolderIsFenced(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(testing.TB) request.Store) {
		st := open(t)
		short := request.Config{Lease: 300 * time.Millisecond}
		paused := &stalled{Store: st}
		paused.paused.Store(true)
		started, resume := make(chan struct{}), requesttest.NewGate(t)
		var mu sync.Mutex
		var results []request.Result // of the calls that ran the handler
		finished := ServerConfig{Hooks: ServerHooks{OnResult: func(ev ResultEvent) {
			if ev.Result == request.ResultCompleted || ev.Result == request.ResultFenced {
				mu.Lock()
				results = append(results, ev.Result)
				mu.Unlock()
			}
		}}}
		holder := &counter{name: "a-", outcomes: []func(context.Context) error{func(context.Context) error {
			close(started)
			resume.Wait() // ignores its context, as stuck code does
			return nil
		}}}
		a := dial(t, serve(t, &ledger{charge: holder.charge},
			grpcgo.UnaryInterceptor(serverInterceptor(t, paused, short, finished))))
		successor := &counter{name: "b-"}
		b := dial(t, serve(t, &ledger{charge: successor.charge},
			grpcgo.UnaryInterceptor(serverInterceptor(t, st, short, finished))))
		req := &testpb.ChargeRequest{Account: "a", Amount: 5}

		type answer struct {
			resp     *testpb.ChargeResponse
			replayed bool
			err      error
		}
		staleResp := make(chan answer, 1)
		go func() {
			resp, replayed, err := call(t.Context(), a, "k", req)
			staleResp <- answer{resp, replayed, err}
		}()
		select {
		case <-started:
		case a := <-staleResp:
			t.Fatalf("the first call ended before the handler ran: %v", a.err)
		case <-time.After(requesttest.WaitTimeout):
			t.Fatal("gave up waiting for the first call to reach the handler")
		}
		var won *testpb.ChargeResponse
		for deadline := time.Now().Add(requesttest.WaitTimeout); won == nil; { // in flight until the stalled lease runs out
			if time.Now().After(deadline) {
				t.Fatal("gave up waiting for the stalled lease to run out")
			}
			resp, _, err := call(t.Context(), b, "k", req)
			switch {
			case err == nil:
				won = resp
			case status.Code(err) != codes.Aborted:
				t.Fatal(err)
			default:
				time.Sleep(50 * time.Millisecond)
			}
		}
		resume.Open()
		stale := requesttest.Recv(t, staleResp, "the fenced call's answer")
		mu.Lock()
		defer mu.Unlock()
		if stale.err != nil || !stale.replayed || !proto.Equal(stale.resp, won) || won.ChargeId != "b-ch-1" {
			t.Fatalf("the fenced call answered %v, replayed %v, %v; want the successor's %v", stale.resp, stale.replayed, stale.err, won)
		}
		if len(results) != 2 || results[0] != request.ResultCompleted || results[1] != request.ResultFenced {
			t.Fatalf("results %v, want the successor completed and the stale holder fenced", results)
		}
	})
}
