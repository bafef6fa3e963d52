package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
)

// deadLetter records key as a dead letter of scope.
func deadLetter(t *testing.T, b bundle, scope, key string) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.claims.DeadLetterTx(ctx, tx, scope, key, fp("p"), 3, errors.New("poison "+key))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestDeadLettersAreListedReleasedAndPurgedByFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	deadLetter(t, b, "billing", "old")
	if _, err := b.pool.Exec(ctx, `UPDATE idemq_inbox SET updated_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	deadLetter(t, b, "billing", "b-1")
	deadLetter(t, b, "billing", "b-2")
	deadLetter(t, b, "shipping", "s-1")
	if c, err := claimIn(t, b, "applied", "p", true); err != nil || !c.New {
		t.Fatal(c, err)
	}

	keys := func(f inbox.DeadFilter) []string {
		t.Helper()
		recs, err := b.store.DeadLetters(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range recs {
			if r.Status != inbox.FailedFinal || r.LastError != "poison "+r.Key || r.Failures != 3 {
				t.Fatalf("listed %+v", r)
			}
			out = append(out, r.Scope+"/"+r.Key)
		}
		return out
	}
	if got := keys(inbox.DeadFilter{}); len(got) != 4 || got[0] != "billing/old" {
		t.Fatalf("all dead letters: %v, want 4, oldest first", got)
	}
	if got := keys(inbox.DeadFilter{Scope: "shipping"}); len(got) != 1 || got[0] != "shipping/s-1" {
		t.Fatalf("by scope: %v", got)
	}
	if got := keys(inbox.DeadFilter{Scope: "billing", Key: "b-2"}); len(got) != 1 || got[0] != "billing/b-2" {
		t.Fatalf("by key: %v", got)
	}
	if got := keys(inbox.DeadFilter{FailedBefore: time.Now().Add(-24 * time.Hour)}); len(got) != 1 || got[0] != "billing/old" {
		t.Fatalf("by age: %v", got)
	}
	st, err := b.store.Stats(ctx)
	if err != nil || st.Dead != 4 || st.Succeeded != 1 || st.OldestDead < 47*time.Hour {
		t.Fatalf("stats %+v, %v", st, err)
	}

	if n, err := b.store.Purge(ctx, inbox.DeadFilter{FailedBefore: time.Now().Add(-24 * time.Hour)}); err != nil || n != 1 {
		t.Fatalf("purge by age: %d, %v", n, err)
	}
	if n, err := b.store.Release(ctx, inbox.DeadFilter{Scope: "billing", Key: "b-1"}); err != nil || n != 1 {
		t.Fatalf("release: %d, %v", n, err)
	}
	if got := keys(inbox.DeadFilter{}); len(got) != 2 {
		t.Fatalf("after purge and release: %v", got)
	}
	// The released key is claimed by its next delivery, as after a failed
	// attempt; the purged one as a new key; a dead letter still refuses.
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for key, want := range map[string]bool{"b-1": true, "old": true, "b-2": false} {
			c, err := b.claims.ClaimTx(ctx, tx, "billing", key, fp("p"))
			if err != nil || c.New != want || c.Failures != 0 {
				t.Errorf("claim %s after release/purge: %+v, %v; want new=%v", key, c, err, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ReleaseTx(ctx, nil, inbox.DeadFilter{}); err == nil {
		t.Fatal("ReleaseTx with a nil tx succeeded")
	}
	if _, err := b.store.DeadLetters(ctx, inbox.DeadFilter{Limit: -1}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
}

// TestReleaseAndPurgeOfEverythingMustSayAll: a filter with no field set
// (as an empty scope, key or class leaves it) releases or purges nothing
// and is an ErrConfig, for dead letters and conflicts alike; All says
// everything is meant.
func TestReleaseAndPurgeOfEverythingMustSayAll(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	deadLetter(t, b, "billing", "b-1")
	deadLetter(t, b, "shipping", "s-1")
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return b.claims.RecordConflictTx(ctx, tx, "billing", "b-1", fp("other"))
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, conflicts := range []bool{false, true} {
		for name, f := range map[string]inbox.DeadFilter{
			"zero":          {Conflicts: conflicts},
			"empty fields":  {Conflicts: conflicts, Scope: "", Key: "", ErrorClass: ""},
			"a limit alone": {Conflicts: conflicts, Limit: 10},
		} {
			if n, err := b.store.Purge(ctx, f); !errors.Is(err, idemq.ErrConfig) || n != 0 {
				t.Errorf("Purge %s (conflicts %v): %d, %v; want an ErrConfig and nothing purged", name, conflicts, n, err)
			}
			if n, err := b.store.Release(ctx, f); !errors.Is(err, idemq.ErrConfig) || n != 0 {
				t.Errorf("Release %s (conflicts %v): %d, %v; want an ErrConfig and nothing released", name, conflicts, n, err)
			}
		}
	}
	if st, err := b.store.Stats(ctx); err != nil || st.Dead != 2 || st.Conflicts != 1 {
		t.Fatalf("after refused calls: %+v, %v; want 2 dead letters and 1 conflict kept", st, err)
	}
	if n, err := b.store.Purge(ctx, inbox.DeadFilter{Conflicts: true, All: true}); err != nil || n != 1 {
		t.Fatalf("purge of every conflict with All: %d, %v", n, err)
	}
	if n, err := b.store.Purge(ctx, inbox.DeadFilter{All: true}); err != nil || n != 2 {
		t.Fatalf("purge of every dead letter with All: %d, %v", n, err)
	}
}
