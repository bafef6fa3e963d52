package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/inbox"
)

// TestExpiredLeases reports, per scope, the records in progress whose
// lease ran out: live leases, finished claims and other scopes stay out,
// the count stops at the limit, and the sample is the oldest one.
func TestExpiredLeases(t *testing.T) {
	t.Parallel()
	eachLayout(t, testExpiredLeases)
}

func testExpiredLeases(t *testing.T, b bundle) {
	ctx := context.Background()
	if got, err := b.store.ExpiredLeases(ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("ExpiredLeases on an empty inbox = %+v, %v", got, err)
	}
	acquire := func(scope, key, owner string) int64 {
		t.Helper()
		r, err := b.store.Acquire(ctx, scope, key, fp("p"), owner, time.Minute)
		if err != nil || !r.New {
			t.Fatalf("Acquire %s/%s = %+v, %v", scope, key, r, err)
		}
		return r.Lease.Token
	}
	// Expired i seconds ago, so that the oldest is known.
	expire := func(key string, ago int) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, `UPDATE idemq_inbox SET lease_until = now() - make_interval(secs => $2) WHERE key_text = $1`, key, ago); err != nil {
			t.Fatal(err)
		}
	}
	var oldestToken int64
	for i := range 3 {
		tok := acquire("mailer", fmt.Sprintf("mail-%d", i), fmt.Sprintf("worker-%d", i))
		expire(fmt.Sprintf("mail-%d", i), 10+i)
		if i == 2 {
			oldestToken = tok
		}
	}
	acquire("mailer", "mail-live", "worker-live")
	acquire("billing", "bill-1", "worker-b")
	expire("bill-1", 5)
	done, err := b.store.Acquire(ctx, "billing", "bill-stuck", fp("p"), "worker-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	expire("bill-stuck", 100)
	// A finished claim leaves the index even though its lease_until passed.
	fin, _ := b.store.Acquire(ctx, "billing", "bill-finished", fp("p"), "worker-b", time.Minute)
	if err := b.store.Complete(ctx, fin.Lease, nil); err != nil {
		t.Fatal(err)
	}
	expire("bill-finished", 200)

	got, err := b.store.ExpiredLeases(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("ExpiredLeases = %+v, want two scopes", got)
	}
	// billing: bill-stuck (100 s, the oldest of all) and bill-1.
	if g := got[0]; g.Scope != "billing" || g.Count != 2 || g.Capped || g.SampleKey != "bill-stuck" || g.SampleOwner != "worker-b" ||
		g.SampleToken != done.Lease.Token || time.Since(g.OldestExpiry) < 90*time.Second {
		t.Errorf("billing = %+v, want 2 with bill-stuck as the sample", g)
	}
	if g := got[1]; g.Scope != "mailer" || g.Count != 3 || g.Capped || g.SampleKey != "mail-2" || g.SampleOwner != "worker-2" || g.SampleToken != oldestToken {
		t.Errorf("mailer = %+v, want 3 with mail-2 as the sample", g)
	}

	capped, err := b.store.ExpiredLeases(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(capped) != 2 || capped[1].Scope != "mailer" || capped[1].Count != 2 || !capped[1].Capped || capped[1].SampleKey != "mail-2" ||
		capped[0].Count != 2 || capped[0].Capped {
		t.Errorf("ExpiredLeases(2) = %+v, want mailer capped at 2 and billing exactly 2", capped)
	}

	// A takeover renews the lease: the key is no longer expired.
	if r, err := b.store.Acquire(ctx, "mailer", "mail-2", fp("p"), "worker-new", time.Minute); err != nil || !r.New {
		t.Fatalf("takeover = %+v, %v", r, err)
	}
	got, err = b.store.ExpiredLeases(ctx, 10)
	if err != nil || len(got) != 2 || got[1].Count != 2 || got[1].SampleKey != "mail-1" {
		t.Errorf("after a takeover = %+v, %v; want mailer 2 with mail-1 as the sample", got, err)
	}
}

// TestExpiredLeasesReadsTheIndex: the query plan reads the partial index
// of records in progress, not the table.
func TestExpiredLeasesReadsTheIndex(t *testing.T) {
	t.Parallel()
	b := setup(t, inbox.Config{})
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO idemq_inbox_scopes (name) VALUES ('s')`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `
INSERT INTO idemq_inbox (expires_at, key_id, scope_id, status, fingerprint)
SELECT now() + interval '1 day', gen_random_uuid(), (SELECT id FROM idemq_inbox_scopes), 2, '\x00' FROM generate_series(1, 20000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE idemq_inbox`); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `EXPLAIN SELECT 1 FROM idemq_inbox r WHERE r.scope_id = 1 AND r.status = 1 AND r.lease_until < now() ORDER BY r.lease_until LIMIT 10`)
	if err != nil {
		t.Fatal(err)
	}
	var all string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		all += line + "\n"
	}
	if !strings.Contains(all, "idemq_inbox_scope_id_lease_until_idx") {
		t.Errorf("plan does not read the leases index:\n%s", all)
	}
}
