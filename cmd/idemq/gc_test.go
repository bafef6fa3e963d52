package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
)

// TestGCRequests: gc also deletes the expired records of request/pgstore,
// and keeps one under a live lease; on a database whose request table was
// never migrated it says so and collects the inbox alone.
func TestGCRequests(t *testing.T) {
	t.Parallel()
	url, pool, _ := database(t)
	if out := mustRun(t, url, "gc"); !strings.Contains(out, "request table idemq_requests is not migrated") {
		t.Errorf("gc without a request table: %q", out)
	}
	ctx := context.Background()
	const ttl = time.Second
	s, err := pgstore.New(pool, pgstore.Config{RecordTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		c, err := s.Claim(ctx, request.ID{Scope: "t", Key: fmt.Sprint("k", i)}, nil, time.Minute)
		if err == nil {
			err = s.Complete(ctx, c.Lease, request.Response{Status: 201})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	held := request.ID{Scope: "t", Key: "held"}
	if _, err := s.Claim(ctx, held, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 100*time.Millisecond) // let the record TTL run out
	var out struct {
		Requests int64 `json:"requests_deleted"`
	}
	mustJSON(t, url, &out, "gc", "--batch-size", "3")
	if out.Requests != 7 {
		t.Errorf("gc deleted %d request records, want 7", out.Requests)
	}
	if rec, err := s.Get(ctx, held); err != nil || rec.State != request.InProgress {
		t.Errorf("the record under a live lease: %+v, %v; want it kept", rec, err)
	}
}
