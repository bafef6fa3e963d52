package idemhttp_test

import (
	nethttp "net/http"
	"testing"
	"time"

	"github.com/google/uuid"

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
			for range 50 {
				if r = post(t, srv.URL, key, "{}"); r.status != nethttp.StatusServiceUnavailable {
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
