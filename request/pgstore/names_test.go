package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/testenv"
)

// TestOneNamePerMeaning: "no record" is one error, idemq.ErrNotFound,
// whether the inbox or a request store says it, and a key reused with
// another payload matches idemq.ErrConflict from both; the store answers
// in request types only, and its lookup finds the request's records.
func TestOneNamePerMeaning(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	s := newStore(t, pool, time.Hour)
	ib, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ib.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	id := request.ID{Scope: "tenant-1", Key: "k-1"}
	if _, err := s.Get(ctx, id); !errors.Is(err, request.ErrNotFound) || !errors.Is(err, idemq.ErrNotFound) {
		t.Fatalf("Get of a new key: %v, want request.ErrNotFound, which is idemq.ErrNotFound", err)
	}
	if _, err := ib.Get(ctx, "s", "k"); !errors.Is(err, inbox.ErrNotFound) || !errors.Is(err, idemq.ErrNotFound) {
		t.Fatalf("inbox Get of a new key: %v, want inbox.ErrNotFound, which is idemq.ErrNotFound", err)
	}

	if c, err := s.Claim(ctx, id, []byte("a"), time.Minute); err != nil || !c.Acquired {
		t.Fatalf("first claim: %+v, %v", c, err)
	}
	_, err = s.Claim(ctx, id, []byte("b"), time.Minute)
	var rc *request.ConflictError
	if !errors.As(err, &rc) || !errors.Is(err, idemq.ErrConflict) {
		t.Fatalf("claim with another fingerprint: %v, want a *request.ConflictError matching idemq.ErrConflict", err)
	}
	if a, err := ib.Acquire(ctx, "s", "k", []byte("a"), "me", time.Minute); err != nil || !a.New {
		t.Fatalf("inbox acquire: %+v, %v", a, err)
	}
	_, err = ib.Acquire(ctx, "s", "k", []byte("b"), "me", time.Minute)
	var ic *inbox.ConflictError
	if !errors.As(err, &ic) || !errors.Is(err, idemq.ErrConflict) {
		t.Fatalf("inbox acquire with another fingerprint: %v, want an *inbox.ConflictError matching idemq.ErrConflict", err)
	}

	recs, err := s.Lookup(ctx, id.Key)
	if err != nil || len(recs) != 1 || recs[0].ID != id || recs[0].State != request.InProgress {
		t.Fatalf("Lookup: %+v, %v; want the in-progress record of %v", recs, err, id)
	}
}
