package idemhttp_test

import (
	"context"
	nethttp "net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/requesttest"
)

// TestStoreUnavailable: while the store is down every protected request
// gets a 503 with Retry-After and the handler never runs unprotected;
// once the store is back, the same key runs the handler once and is
// replayed after.
func TestStoreUnavailable(t *testing.T) {
	for _, kind := range requesttest.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			s, server := kind.Outage(t)
			o := &orders{}
			srv := serverWith(t, s, idemhttp.Config{Guard: request.Config{StoreTimeout: 2 * time.Second}}, o)
			key := quoted(uuid.NewString())
			if r := post(t, srv.URL, quoted(uuid.NewString()), "{}"); r.status != nethttp.StatusCreated {
				t.Fatalf("before the outage: %+v", r)
			}
			server.Stop()
			for range 3 {
				r := post(t, srv.URL, key, "{}")
				if r.status != nethttp.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemUnavailable {
					t.Fatalf("store down: %d %v %s, want 503 with Retry-After", r.status, r.header, r.body)
				}
			}
			if n := o.runs.Load(); n != 1 {
				t.Fatalf("handler ran %d times during the outage, want none", n-1)
			}
			server.Start()
			var r reply
			// A claim given up on at StoreTimeout may land once the server
			// is back; it is handed back at once, meanwhile the key is a 409.
			for range 50 {
				if r = post(t, srv.URL, key, "{}"); r.status != nethttp.StatusServiceUnavailable && r.status != nethttp.StatusConflict {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if r.status != nethttp.StatusCreated || r.replayed() {
				t.Fatalf("after the store returned: %+v, want 201", r)
			}
			if again := post(t, srv.URL, key, "{}"); !again.replayed() || again.body != r.body {
				t.Fatalf("retry after recovery: %+v, want the replay", again)
			}
			if n := o.runs.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2 (one per key)", n)
			}
		})
	}
}

// deaf is a store whose calls named in hang block, ignoring their context,
// until the test ends: a driver stuck on a dead connection.
type deaf struct {
	request.Store
	gate *requesttest.Gate
	hang map[string]bool
}

func (s *deaf) stuck(op string) {
	if s.hang[op] {
		s.gate.Wait()
	}
}

func (s *deaf) Claim(ctx context.Context, id request.ID, fp []byte, d time.Duration) (request.Claim, error) {
	s.stuck("claim")
	return s.Store.Claim(ctx, id, fp, d)
}

func (s *deaf) Complete(ctx context.Context, l idemq.Lease, resp request.Response) error {
	s.stuck("complete")
	return s.Store.Complete(ctx, l, resp)
}

func (s *deaf) Extend(ctx context.Context, l idemq.Lease, d time.Duration) (idemq.Lease, error) {
	s.stuck("extend")
	return s.Store.Extend(ctx, l, d)
}

// TestStoreIgnoresContext: a store call that hangs and ignores its context
// never leaves a request unanswered: a hung claim is a 503 after
// StoreTimeout; a hung renewal or completion still sends the handler's
// response, reported as a store failure.
func TestStoreIgnoresContext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hang   string
		status int
		result request.Result
	}{
		{"claim", nethttp.StatusServiceUnavailable, request.ResultUnavailable},
		{"extend", nethttp.StatusCreated, request.ResultCompleted},
		{"complete", nethttp.StatusCreated, request.ResultStoreFailed},
	} {
		t.Run(tc.hang, func(t *testing.T) {
			t.Parallel()
			s := &deaf{Store: requesttest.OpenPostgres(t), gate: requesttest.NewGate(t), hang: map[string]bool{tc.hang: true}}
			results := make(chan request.Result, 1)
			cfg := idemhttp.Config{
				Guard: request.Config{Lease: 30 * time.Millisecond, StoreTimeout: 100 * time.Millisecond},
				Hooks: idemhttp.Hooks{OnResult: func(ev idemhttp.ResultEvent) { results <- ev.Result }},
			}
			srv := server(t, s, cfg, func(w nethttp.ResponseWriter, r *nethttp.Request) {
				time.Sleep(50 * time.Millisecond) // long enough for a renewal
				w.WriteHeader(nethttp.StatusCreated)
			})
			if r := post(t, srv.URL, quoted(uuid.NewString()), "{}"); r.status != tc.status {
				t.Fatalf("answered %d %s, want %d", r.status, r.body, tc.status)
			}
			if got := requesttest.Recv(t, results, "the request's result"); got != tc.result {
				t.Fatalf("result %v, want %v", got, tc.result)
			}
		})
	}
}
