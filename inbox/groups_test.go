package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/inbox"
)

// TestDeadGroups: dead letters group by error class and scope with count,
// first and last failure and a sample; a group's filter releases exactly
// its records; records stored without a class are one unclassified group
// until ClassifyDead classifies them.
func TestDeadGroups(t *testing.T) {
	t.Parallel()
	eachLayout(t, testDeadGroups)
}

// testDeadGroups groups, releases and classifies dead letters in b's
// inbox, whose layout the partitioned run changes.
func testDeadGroups(t *testing.T, b bundle) {
	ctx := context.Background()
	dead := func(scope, key, cause string) {
		t.Helper()
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.claims.DeadLetterTx(ctx, tx, scope, key, fp(key), 3, errors.New(cause))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	dead("billing", "b-1", "charge 0192f3a4-5b6c-7d8e-9f01-23456789abcd declined (SQLSTATE 23505)")
	dead("billing", "b-2", "charge 0192f3a4-5b6c-7d8e-9f01-000000000001 declined (SQLSTATE 23505)")
	dead("billing", "b-3", "timeout after 30s")
	dead("shipping", "s-1", "timeout after 5s")
	groups, err := b.store.DeadGroups(ctx, inbox.DeadFilter{})
	if err != nil || len(groups) != 3 {
		t.Fatalf("groups %+v, %v; want 3", groups, err)
	}
	g := groups[0]
	if g.Scope != "billing" || g.Count != 2 || g.Class != "sqlstate 23505: charge <uuid> declined" || g.SampleKey != "b-1" || g.FirstFailed.After(g.LastFailed) || len(g.ID) != 12 {
		t.Fatalf("first group %+v", g)
	}
	if recs, err := b.store.DeadLetters(ctx, g.Filter()); err != nil || len(recs) != 2 || recs[0].ErrorClass != g.Class {
		t.Fatalf("the group's dead letters: %+v, %v", recs, err)
	}
	if n, err := b.store.Release(ctx, g.Filter()); err != nil || n != 2 {
		t.Fatalf("release the group: %d, %v; want 2", n, err)
	}
	if n, err := b.store.Release(ctx, g.Filter()); err != nil || n != 0 {
		t.Fatalf("release the group again: %d, %v; want 0", n, err)
	}
	// A record dead-lettered by an older version has no class.
	if _, err := b.pool.Exec(ctx, `UPDATE idemq_inbox SET error_class = NULL WHERE status = 4`); err != nil {
		t.Fatal(err)
	}
	groups, err = b.store.DeadGroups(ctx, inbox.DeadFilter{})
	if err != nil || len(groups) != 2 || groups[0].Class != inbox.Unclassified {
		t.Fatalf("groups %+v, %v; want the unclassified ones", groups, err)
	}
	if n, err := b.store.ClassifyDead(ctx, 0); err != nil || n != 2 {
		t.Fatalf("ClassifyDead: %d, %v; want 2", n, err)
	}
	groups, err = b.store.DeadGroups(ctx, inbox.DeadFilter{ErrorClass: "timeout after <n>"})
	if err != nil || len(groups) != 2 || groups[0].Count != 1 {
		t.Fatalf("timeout groups %+v, %v; want one per scope", groups, err)
	}
}

// TestLookup: a key's records in every scope, and none for an unknown key.
func TestLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	for _, scope := range []string{"billing", "shipping"} {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.claims.ClaimTx(ctx, tx, scope, "order-7", fp("p"))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	recs, err := b.store.Lookup(ctx, "order-7")
	if err != nil || len(recs) != 2 || recs[0].Key != "order-7" || recs[0].Status != inbox.Succeeded {
		t.Fatalf("Lookup: %+v, %v", recs, err)
	}
	if recs, err := b.store.Lookup(ctx, "nope"); err != nil || len(recs) != 0 {
		t.Fatalf("Lookup of an unknown key: %+v, %v", recs, err)
	}
}
