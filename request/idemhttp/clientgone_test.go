package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	nethttp "net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/requesttest"
)

// TestClientGoneAfterFinalResponse: with FinalDefault, a client that
// disconnects while the handler runs does not undo the handler's work.
// When the handler then answers 201, the response is stored and the
// client's retry gets it replayed; the handler does not run again. A
// handler that gives up without writing anything releases the key, and
// the retry runs it.
func TestClientGoneAfterFinalResponse(t *testing.T) {
	s := requesttest.OpenPostgres(t)
	for _, tc := range []struct {
		name     string
		answer   bool
		wantRuns int64
		wantRec  request.State
	}{
		{"201 after the client left", true, 1, request.Completed},
		{"nothing written after the client left", false, 2, request.Released},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs atomic.Int64
			started := make(chan struct{}, 1)
			srv := server(t, s, idemhttp.Config{}, func(w nethttp.ResponseWriter, r *nethttp.Request) {
				n := runs.Add(1)
				if n == 1 {
					started <- struct{}{}
					<-r.Context().Done() // the client hung up
					if !tc.answer {
						return
					}
				}
				w.WriteHeader(nethttp.StatusCreated)
				fmt.Fprintf(w, "order %d", n)
			})
			key := uuid.NewString()
			ctx, hangUp := context.WithCancel(context.Background())
			req, _ := nethttp.NewRequestWithContext(ctx, nethttp.MethodPost, srv.URL+"/orders", strings.NewReader("{}"))
			req.Header.Set(idemhttp.HeaderKey, quoted(key))
			req.Header.Set("Content-Type", "application/json")
			gone := make(chan error, 1)
			go func() {
				resp, err := client.Do(req)
				if err == nil {
					_ = resp.Body.Close()
				}
				gone <- err
			}()
			select {
			case <-started:
			case err := <-gone:
				t.Fatalf("the first request ended with %v before it reached the handler", err)
			case <-time.After(requesttest.WaitTimeout):
				t.Fatal("gave up waiting for the first request to reach the handler")
			}
			hangUp() // closes the connection: a real disconnect
			if err := requesttest.Recv(t, gone, "the first request to end"); !errors.Is(err, context.Canceled) {
				t.Fatalf("the first request ended with %v, want the client's own cancellation", err)
			}
			// Wait for the handler to finish with the key.
			id := request.ID{Key: key}
			deadline := time.Now().Add(time.Minute)
			for {
				rec, err := s.Get(context.Background(), id)
				if err == nil && rec.State != request.InProgress {
					if rec.State != tc.wantRec {
						t.Fatalf("record %s after the client left, want %s", rec.State, tc.wantRec)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the key is still %+v, %v a minute after the client left", rec, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			r := post(t, srv.URL, quoted(key), "{}")
			if r.status != nethttp.StatusCreated || r.replayed() != tc.answer || (tc.answer && r.body != "order 1") {
				t.Fatalf("retry: %+v", r)
			}
			if n := runs.Load(); n != tc.wantRuns {
				t.Fatalf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}
