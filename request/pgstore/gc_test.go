package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
)

// TestGCOfStalledHolder: GC removes the record of a holder that stalled
// past its lease and the record TTL (its request's context ended, so its
// lease was renewed no more), and a new request claims the key afresh.
// The new claim's token is above the stalled holder's (tokens never go
// back), the stalled holder's late finish is refused with ErrLeaseLost,
// and the new request's outcome stands.
func TestGCOfStalledHolder(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	s, err := pgstore.New(testenv.Postgres(t), pgstore.Config{RecordTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := request.New(s, request.Config{Lease: 300 * time.Millisecond, StoreTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	id := request.ID{Scope: "t", Key: "stalled"}
	fp := request.Fingerprint([]byte("POST /orders"))
	reqCtx, clientGone := context.WithCancel(ctx)
	d, err := g.Begin(reqCtx, id, fp)
	if err != nil || d.Run == nil {
		t.Fatalf("Begin = %+v, %v", d, err)
	}
	stalled := d.Run
	clientGone() // renewal stops; the handler goes on, stuck
	time.Sleep(ttl + 300*time.Millisecond)
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := s.GC(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("GC never collected the stalled holder's record")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d, err = g.Begin(ctx, id, fp)
	if err != nil || d.Run == nil {
		t.Fatalf("Begin after GC = %+v, %v; want a new attempt", d, err)
	}
	fresh := d.Run
	if fresh.Lease().Token <= stalled.Lease().Token {
		t.Fatalf("the new claim's token %d is not above the stalled holder's %d", fresh.Lease().Token, stalled.Lease().Token)
	}
	if err := stalled.Complete(request.Response{Status: 201, Body: []byte("stale")}); !errors.Is(err, idemq.ErrLeaseLost) {
		t.Fatalf("the stalled holder's Complete = %v, want ErrLeaseLost", err)
	}
	if err := fresh.Complete(request.Response{Status: 201, Body: []byte("fresh")}); err != nil {
		t.Fatalf("the new attempt's Complete: %v", err)
	}
	rec, err := s.Get(ctx, id)
	if err != nil || rec.State != request.Completed || string(rec.Response.Body) != "fresh" {
		t.Fatalf("record = %+v, %v; want the new attempt's response", rec, err)
	}
}
