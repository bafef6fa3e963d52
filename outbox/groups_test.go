package outbox_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/outbox"
)

// TestDeadGroups: dead letters buried without a class are one
// unclassified group until ClassifyDead classifies them from their text;
// then they group by class and destination with counts, first and last
// failure and a sample; a group's filter replays exactly its rows with
// their ids, a second replay moves nothing, and purge takes a group.
func TestDeadGroups(t *testing.T) {
	b := setup(t, outbox.Config{})
	var msgs []outbox.Message
	for i := range 9 {
		dest := "hooks"
		if i%3 == 2 {
			dest = "billing"
		}
		msgs = append(msgs, outbox.Message{Destination: dest, Key: fmt.Sprintf("cust-%d/o-%d", i%2, i), Payload: fmt.Appendf(nil, "p%d", i)})
	}
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return b.ob.EnqueueTx(b.ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
	kill(t, b, "webhook: endpoint e: HTTP 503: busy 3f2a9c7e", "p0", "p1", "p2")
	kill(t, b, "webhook: endpoint e: HTTP 502: busy 4c1b0d2f", "p3", "p4", "p5")
	kill(t, b, `dial tcp 10.0.0.7:443: connection refused`, "p6", "p7", "p8")

	groups, err := b.ob.DeadGroups(b.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 2 || groups[0].Class != outbox.Unclassified || groups[0].Count != 6 || groups[0].Destination != "hooks" {
		t.Fatalf("before classifying: %+v, %v; want the unclassified groups", groups, err)
	}
	for {
		n, err := b.ob.ClassifyDead(b.ctx, 4)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	groups, err = b.ob.DeadGroups(b.ctx, outbox.DeadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		class, dest string
		n           int64
	}{
		{"http 5xx: webhook: endpoint e: HTTP <n>: busy <hex>", "hooks", 4},
		{"dial tcp <addr>: connection refused", "hooks", 2},
		{"http 5xx: webhook: endpoint e: HTTP <n>: busy <hex>", "billing", 2},
		{"dial tcp <addr>: connection refused", "billing", 1},
	}
	if len(groups) != len(want) {
		t.Fatalf("groups %+v, want %+v", groups, want)
	}
	for i, w := range want {
		g := groups[i]
		if g.Class != w.class || g.Destination != w.dest || g.Count != w.n || g.FirstFailed.After(g.LastFailed) || g.SampleError == "" || len(g.ID) != 12 {
			t.Errorf("group %d: %+v, want %+v", i, g, w)
		}
	}
	hooks5xx := groups[0]
	if sample, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{IDs: []uuid.UUID{hooks5xx.SampleID}}); err != nil || len(sample) != 1 || string(sample[0].Payload) != "p0" || sample[0].ErrorClass != hooks5xx.Class {
		t.Fatalf("sample %+v, %v; want p0, the group's oldest", sample, err)
	}
	if got, err := b.ob.DeadGroup(b.ctx, hooks5xx.ID[:8]); err != nil || got.ID != hooks5xx.ID {
		t.Fatalf("DeadGroup(%s): %+v, %v", hooks5xx.ID[:8], got, err)
	}
	if _, err := b.ob.DeadGroup(b.ctx, "000000"); !errors.Is(err, outbox.ErrNoGroup) {
		t.Fatalf("DeadGroup of an unknown id: %v, want ErrNoGroup", err)
	}
	if got, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{KeyPrefix: "cust-1/"}); err != nil || len(got) != 4 {
		t.Fatalf("key prefix cust-1/: %d dead letters, %v; want 4", len(got), err)
	}

	before, err := b.ob.DeadLetters(b.ctx, hooks5xx.Filter())
	if err != nil || len(before) != 4 {
		t.Fatalf("the group's dead letters: %+v, %v", before, err)
	}
	n, err := b.ob.Replay(b.ctx, hooks5xx.Filter())
	if err != nil || n != 4 {
		t.Fatalf("replay the group: %d, %v; want 4", n, err)
	}
	if n, err := b.ob.Replay(b.ctx, hooks5xx.Filter()); err != nil || n != 0 {
		t.Fatalf("replay the group again: %d, %v; want 0", n, err)
	}
	pending := rows(t, b)
	if len(pending) != 4 {
		t.Fatalf("pending after replay: %+v", pending)
	}
	for i, p := range pending {
		if p.ID != before[i].ID || p.Attempts != 0 {
			t.Errorf("replayed row %d: %+v, want id %s and attempts 0", i, p, before[i].ID)
		}
	}
	if n, err := b.ob.Purge(b.ctx, outbox.DeadFilter{ErrorClass: "dial tcp <addr>: connection refused", Destination: "billing"}); err != nil || n != 1 {
		t.Fatalf("purge a group: %d, %v; want 1", n, err)
	}
	// Everything that failed since an hour ago: the 4 left.
	if n, err := b.ob.Replay(b.ctx, outbox.DeadFilter{FailedAfter: time.Now().Add(-time.Hour)}); err != nil || n != 4 {
		t.Fatalf("replay since T: %d, %v; want 4", n, err)
	}
	if groups, err := b.ob.DeadGroups(b.ctx, outbox.DeadFilter{}); err != nil || len(groups) != 0 {
		t.Fatalf("groups left: %+v, %v", groups, err)
	}
}

// TestDeadLettersKeyset: After pages through the dead letters in enqueue
// order, a page at a time; an id that is gone matches nothing.
func TestDeadLettersKeyset(t *testing.T) {
	b := setup(t, outbox.Config{})
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Destination: "d", Key: fmt.Sprint("k", i), Payload: fmt.Appendf(nil, "p%d", i)})
	}
	if err := b.ob.Enqueue(b.ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	kill(t, b, "boom", "p0", "p1", "p2", "p3", "p4")
	var seen []string
	f := outbox.DeadFilter{Limit: 2}
	for {
		page, err := b.ob.DeadLetters(b.ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page {
			seen = append(seen, string(d.Payload))
		}
		if len(page) < 2 {
			break
		}
		f.After = page[len(page)-1].ID
	}
	if fmt.Sprint(seen) != "[p0 p1 p2 p3 p4]" {
		t.Fatalf("pages %v", seen)
	}
	if got, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{After: uuid.New()}); err != nil || len(got) != 0 {
		t.Fatalf("after an unknown id: %+v, %v", got, err)
	}
}

// TestDeadGroupSummaryExact: the groups' summary that the dead-letter
// table's triggers keep (migration 0006) says what grouping the table
// says (counts, first and last failure, sample) after concurrent
// transactions bury, replay and purge rows of the same groups, after a
// purge that removes a group's first and last failures, after
// ClassifyDead, and after TRUNCATE.
func TestDeadGroupSummaryExact(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	scan := outbox.DeadFilter{FailedBefore: time.Now().Add(100 * 365 * 24 * time.Hour), Limit: 1000} // not summarized
	same := func(when string) {
		t.Helper()
		sum, err := b.ob.DeadGroups(b.ctx, outbox.DeadFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		all, err := b.ob.DeadGroups(b.ctx, scan)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprintf("%+v", sum) != fmt.Sprintf("%+v", all) {
			t.Fatalf("%s: the summary says\n%+v\nthe table says\n%+v", when, sum, all)
		}
	}
	bury := `INSERT INTO ` + b.deadTable() + ` (seq, id, created_at, failed_at, attempts, destination, payload, key, last_error, error_class)
SELECT nextval(pg_get_serial_sequence('` + b.table() + `', 'seq')), gen_random_uuid(), now(), now() - random() * interval '1 day', 3,
       'dest-' || (i % 3), '\x00', 'k' || (i % 7), 'boom', CASE WHEN i % 5 = 0 THEN NULL ELSE 'class ' || (i % 4) END
FROM generate_series(1, $1) AS i`
	errs := make(chan error, 64)
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 25 {
				var err error
				switch (w + i) % 3 {
				case 0:
					_, err = b.pool.Exec(b.ctx, bury, 20)
				case 1:
					_, err = b.ob.Purge(b.ctx, outbox.DeadFilter{Key: fmt.Sprintf("k%d", i%7), Limit: 5})
				default:
					_, err = b.ob.Replay(b.ctx, outbox.DeadFilter{Destination: fmt.Sprintf("dest-%d", i%3), Limit: 7})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 4 {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatal("the writers did not finish within 2 minutes")
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	same("after concurrent bury, replay and purge")

	groups, err := b.ob.DeadGroups(b.ctx, outbox.DeadFilter{Limit: 1})
	if err != nil || len(groups) != 1 {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	g := groups[0]
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM `+b.deadTable()+` WHERE destination = $1 AND error_class IS NOT DISTINCT FROM nullif($2, '`+outbox.Unclassified+`')
  AND failed_at IN ($3, $4)`, g.Destination, g.Class, g.FirstFailed, g.LastFailed); err != nil {
		t.Fatal(err)
	}
	same("after removing a group's first and last failure")
	if _, err := b.pool.Exec(b.ctx, `UPDATE `+b.deadTable()+` SET error_class = NULL WHERE seq % 2 = 0`); err != nil {
		t.Fatal(err)
	}
	same("after unclassifying half")
	for {
		n, err := b.ob.ClassifyDead(b.ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	same("after ClassifyDead")
	if st, err := b.ob.Stats(b.ctx); err != nil || st.Dead == 0 {
		t.Fatalf("Stats: %+v, %v", st, err)
	}
	if _, err := b.pool.Exec(b.ctx, `TRUNCATE `+b.deadTable()); err != nil {
		t.Fatal(err)
	}
	same("after TRUNCATE")
	if st, err := b.ob.Stats(b.ctx); err != nil || st.Dead != 0 {
		t.Fatalf("Stats after TRUNCATE: %+v, %v", st, err)
	}
}
