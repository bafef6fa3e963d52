package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
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

// TestMigrateRequestsComponent: migrate --components requests creates
// request/pgstore's table (named by --requests-table), so that a deploy
// gated on `idemq migrate validate` can gate on it, and gc then collects
// it.
func TestMigrateRequestsComponent(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	wantCode(t, url, exitPending, "migrate", "validate", "--components", "requests")
	mustRun(t, url, "migrate", "--components", "outbox,inbox,requests")
	wantCode(t, url, exitOK, "migrate", "validate", "--components", "outbox,inbox,requests")
	var listed []migration
	mustJSON(t, url, &listed, "migrate", "list", "--components", "requests")
	if len(listed) == 0 || listed[0].Table != pgstore.TableDefault || listed[len(listed)-1].AppliedAt == nil {
		t.Fatalf("migrate list --components requests: %+v, want the applied migrations of %s", listed, pgstore.TableDefault)
	}
	if out := mustRun(t, url, "gc"); strings.Contains(out, "not migrated") {
		t.Errorf("gc after migrate --components requests: %q", out)
	}
	wantCode(t, url, exitPending, "--requests-table", "api_requests", "migrate", "validate", "--components", "requests")
	mustRun(t, url, "--requests-table", "api_requests", "migrate", "--components", "requests")
	if out := mustRun(t, url, "gc", "--requests-table", "api_requests"); strings.Contains(out, "not migrated") {
		t.Errorf("gc --requests-table api_requests after migrating it: %q", out)
	}
}
