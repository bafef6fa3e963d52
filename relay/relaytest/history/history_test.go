package history_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/relay/relaytest/history"
)

// t0 is the start of every synthetic history; tick(n) is n ms after it.
var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func tick(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// scenario builds a synthetic history: rows enqueued, then what happened
// to them, one call per event.
type scenario struct {
	h    history.History
	rows map[int64]history.Row // by seq
}

func newScenario(rows ...history.Row) *scenario {
	s := &scenario{rows: map[int64]history.Row{}}
	for _, r := range rows {
		r.ID = uuid.New()
		if r.Destination == "" {
			r.Destination = "d"
		}
		s.rows[r.Seq] = r
		s.h.Enqueued = append(s.h.Enqueued, r)
	}
	return s
}

// row is a row of key at seq.
func row(key string, seq int64) history.Row { return history.Row{Key: key, Seq: seq} }

// publish records a publish of the row at seq by relay under token of its
// partition (partition 0 for keyed rows, -1 for unkeyed ones) at ms.
func (s *scenario) publish(seq int64, relay string, token int64, ms int) *scenario {
	s.h.Published = append(s.h.Published, s.event(seq, relay, token, ms))
	return s
}

func (s *scenario) reject(seq int64, relay string, token int64, ms int) *scenario {
	s.h.Rejected = append(s.h.Rejected, s.event(seq, relay, token, ms))
	return s
}

func (s *scenario) purge(seq int64, ms int) *scenario {
	s.h.Purged = append(s.h.Purged, history.Purge{ID: s.rows[seq].ID, At: tick(ms)})
	return s
}

func (s *scenario) event(seq int64, relay string, token int64, ms int) history.Publish {
	r := s.rows[seq]
	part := 0
	if r.Key == "" {
		part, token = -1, 0
	}
	return history.Publish{ID: r.ID, Key: r.Key, Destination: r.Destination, Seq: r.Seq,
		Relay: relay, Partition: part, LeaseToken: token, At: tick(ms)}
}

func check(t *testing.T, s *scenario, rules history.Rules) history.Report {
	t.Helper()
	r, err := history.Check(s.h, rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	return r
}

// want checks that the report's violations are exactly kinds, the first
// one about key and seqs.
func want(t *testing.T, r history.Report, key string, seqs []int64, kinds ...history.Kind) {
	t.Helper()
	var got []history.Kind
	for _, v := range r.Violations {
		got = append(got, v.Kind)
	}
	if !slices.Equal(got, kinds) {
		t.Fatalf("violations %v, want %v:\n%s", got, kinds, r)
	}
	first := r.Violations[0]
	if first.Key != key || !slices.Equal(first.Seqs, seqs) {
		t.Fatalf("first violation about key %q rows %v, want key %q rows %v: %s", first.Key, first.Seqs, key, seqs, first)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), first.Detail) {
		t.Fatalf("Err() = %v, want it to name the first violation %q", err, first)
	}
}

func TestCleanHistoryWithDuplicatesHasNoViolation(t *testing.T) {
	s := newScenario(row("a", 1), row("b", 2), row("a", 3), row("", 4)).
		publish(1, "r1", 1, 10).publish(2, "r1", 1, 11).publish(4, "r1", 0, 12).
		// r1 died before its delete: r2 takes over and publishes again.
		publish(1, "r2", 2, 20).publish(2, "r2", 2, 20).publish(3, "r2", 2, 21).publish(4, "r2", 0, 22)
	r := check(t, s, history.Rules{QuietFrom: tick(0), Bound: time.Second})
	if r.Err() != nil || r.Published != 4 || r.Publishes != 7 || r.Duplicates != 3 {
		t.Fatalf("got %s, want 4 rows published in 7 publishes (3 duplicates), no violations", r)
	}
}

func TestReorderedNamesTheOvertakenRow(t *testing.T) {
	// seq 3 is first published before seq 1 of its key; its duplicate
	// later does not matter, nor does the unkeyed row.
	s := newScenario(row("a", 1), row("", 2), row("a", 3)).
		publish(3, "r2", 5, 10).publish(2, "r2", 0, 11).publish(1, "r1", 4, 12).publish(3, "r1", 4, 13)
	r := check(t, s, history.Rules{})
	want(t, r, "a", []int64{3, 1}, history.Reordered, history.StaleOwner, history.StaleOwner)
	if d := r.Violations[0].Detail; !strings.Contains(d, "by r2") || !strings.Contains(d, "first published at 12:00:00.012000 by r1") {
		t.Fatalf("detail %q does not say who published what when", d)
	}
}

// enqueued is a row of key at seq, written at ms by transaction tx, which
// committed at committed ms.
func enqueued(key string, seq, tx int64, written, committed int) history.Row {
	return history.Row{Key: key, Seq: seq, Tx: tx, Written: tick(written), Committed: tick(committed)}
}

func TestReorderedFollowsTheRealTimeOrderOfEnqueues(t *testing.T) {
	// Transaction 1 writes seq 1 at 0 ms and commits at 50 ms (a long
	// writer, a prepared transaction); transaction 2 writes seq 2 at 10 ms
	// and commits at 20 ms: concurrent, either may go first. Transaction 3
	// writes seq 3 and 4 at 60 ms, after transaction 1 committed: both
	// follow seq 1, and seq 4 follows seq 3.
	rows := []history.Row{enqueued("a", 1, 1, 0, 50), enqueued("a", 2, 2, 10, 20),
		enqueued("a", 3, 3, 60, 70), enqueued("a", 4, 3, 60, 70)}
	ok := newScenario(rows...).publish(2, "r1", 1, 30).publish(1, "r1", 1, 80).publish(3, "r1", 1, 90).publish(4, "r1", 1, 91)
	if r := check(t, ok, history.Rules{}); r.Err() != nil {
		t.Fatalf("concurrent transactions may publish in either order: %v", r.Err())
	}
	late := newScenario(rows...).publish(2, "r1", 1, 30).publish(3, "r1", 1, 80).publish(1, "r1", 1, 90).publish(4, "r1", 1, 91)
	r := check(t, late, history.Rules{})
	want(t, r, "a", []int64{3, 1}, history.Reordered)
	if d := r.Violations[0].Detail; !strings.Contains(d, "committed at 12:00:00.050000 before seq 3 was written at 12:00:00.060000") {
		t.Fatalf("detail %q does not say why seq 1 precedes seq 3", d)
	}
	inTx := newScenario(rows...).publish(2, "r1", 1, 30).publish(1, "r1", 1, 80).publish(4, "r1", 1, 90).publish(3, "r1", 1, 91)
	want(t, check(t, inTx, history.Rules{}), "a", []int64{4, 3}, history.Reordered)
}

func TestReorderedWithinOneTimestampByRecordOrder(t *testing.T) {
	// One batch recorded with one timestamp, seq 2 before seq 1.
	s := newScenario(row("a", 1), row("a", 2)).publish(2, "r1", 1, 10).publish(1, "r1", 1, 10)
	want(t, check(t, s, history.Rules{}), "a", []int64{2, 1}, history.Reordered)
}

func TestRejectedRowLetsFollowersPassUnlessParked(t *testing.T) {
	// seq 1 is rejected (a dead letter), seq 2 passes it, seq 1 is
	// replayed and published last.
	s := newScenario(row("a", 1), row("a", 2)).
		reject(1, "r1", 1, 10).publish(2, "r1", 1, 11).publish(1, "r1", 1, 30)
	if r := check(t, s, history.Rules{}); r.Err() != nil {
		t.Fatalf("followers of a dead letter may pass it: %v", r.Err())
	}
	want(t, check(t, s, history.Rules{ParkFollowers: true}), "a", []int64{2, 1}, history.Reordered)

	// Passing before the rejection is a reorder either way.
	early := newScenario(row("a", 1), row("a", 2)).
		publish(2, "r1", 1, 5).reject(1, "r1", 1, 10).publish(1, "r1", 1, 30)
	r := check(t, early, history.Rules{})
	want(t, r, "a", []int64{2, 1}, history.Reordered)
	if d := r.Violations[0].Detail; !strings.Contains(d, "rejected (a dead letter) at 12:00:00.010000") {
		t.Fatalf("detail %q does not say the overtaken row was rejected later", d)
	}
}

func TestPurgedRowIsOwedNothingAndFreesItsKey(t *testing.T) {
	s := newScenario(row("a", 1), row("a", 2)).
		reject(1, "r1", 1, 10).purge(1, 20).publish(2, "r1", 1, 21)
	r := check(t, s, history.Rules{ParkFollowers: true, QuietFrom: tick(0), Bound: time.Second})
	if r.Err() != nil || r.Purged != 1 {
		t.Fatalf("got %s, want the purge counted and no violation", r)
	}
	// Parked followers that pass before the purge broke order.
	early := newScenario(row("a", 1), row("a", 2)).
		reject(1, "r1", 1, 10).publish(2, "r1", 1, 15).purge(1, 20)
	want(t, check(t, early, history.Rules{ParkFollowers: true}), "a", []int64{2, 1}, history.Reordered)
}

func TestStaleOwnerPublishesAfterItsSuccessor(t *testing.T) {
	// r1 owns the partition under token 3; r2 takes over (token 4) and
	// publishes key b; then r1, stale, publishes key a. Order within each
	// key holds, the fence does not.
	s := newScenario(row("a", 1), row("b", 2)).
		publish(2, "r2", 4, 10).publish(1, "r1", 3, 20)
	want(t, check(t, s, history.Rules{}), "a", []int64{1, 2}, history.StaleOwner)

	// A successor that has not published yet does not fence anything, and
	// nor does a token on another partition.
	ok := newScenario(row("a", 1), row("b", 2)).publish(1, "r1", 3, 10).publish(2, "r2", 4, 20).publish(1, "r1", 3, 10)
	if r := check(t, ok, history.Rules{}); r.Err() != nil {
		t.Fatal(r.Err())
	}
}

func TestStaleOwnerAgainstTheEarliestLaterToken(t *testing.T) {
	// Token 7 started before token 6 published: token 5 is fenced from
	// token 7's first publish on.
	s := newScenario(row("a", 1), row("b", 2), row("c", 3)).
		publish(3, "r3", 7, 10).publish(2, "r2", 6, 30).publish(1, "r1", 5, 20)
	want(t, check(t, s, history.Rules{}), "a", []int64{1, 3}, history.StaleOwner, history.StaleOwner)
}

func TestLostRowIsNamed(t *testing.T) {
	s := newScenario(row("a", 1), row("a", 2), row("b", 3)).publish(1, "r1", 1, 10).publish(3, "r1", 1, 11)
	r := check(t, s, history.Rules{})
	want(t, r, "a", []int64{2}, history.Lost)
	if d := r.Violations[0].Detail; !strings.Contains(d, "never rejected") {
		t.Fatalf("detail %q does not say whether the row was rejected", d)
	}
	// A rejected row left in the dead letters is lost too: the test must
	// replay or purge it.
	dead := newScenario(row("a", 1)).reject(1, "r1", 1, 10)
	want(t, check(t, dead, history.Rules{}), "a", []int64{1}, history.Lost)
}

func TestLateRowAfterTheFaultsStopped(t *testing.T) {
	// Faults stop at 100 ms, bound 50 ms: seq 1 at 90 ms is fine (before
	// the quiet), seq 2 at 140 ms is fine, seq 3 at 200 ms is late; seq 4
	// was enqueued at 300 ms and published at 320 ms, in time.
	s := newScenario(row("a", 1), row("b", 2), row("c", 3), history.Row{Key: "d", Seq: 4, Committed: tick(300)}).
		publish(1, "r1", 1, 90).publish(2, "r1", 1, 140).publish(3, "r1", 1, 200).publish(4, "r1", 1, 320)
	want(t, check(t, s, history.Rules{QuietFrom: tick(100), Bound: 50 * time.Millisecond}), "c", []int64{3}, history.Late)
	if r := check(t, s, history.Rules{QuietFrom: tick(100)}); r.Err() != nil {
		t.Fatalf("no bound, no lateness: %v", r.Err())
	}
}

func TestPhantomAndAlteredPublishes(t *testing.T) {
	s := newScenario(row("a", 1))
	s.publish(1, "r1", 1, 10)
	ghost := history.Publish{ID: uuid.New(), Key: "x", Destination: "d", Seq: 9, Relay: "r2", Partition: 0, LeaseToken: 1, At: tick(5)}
	s.h.Published = append(s.h.Published, ghost)
	want(t, check(t, s, history.Rules{}), "x", []int64{9}, history.Phantom)

	altered := newScenario(row("a", 1))
	altered.publish(1, "r1", 1, 10)
	altered.h.Published[0].Seq = 7
	want(t, check(t, altered, history.Rules{}), "a", []int64{1}, history.Altered)
}

func TestViolationsInTheOrderTheyHappened(t *testing.T) {
	// A reorder at 150 ms, a late first publish at 160 ms and a lost row,
	// recorded out of order: the report names the reorder first and the
	// lost row last.
	s := newScenario(row("a", 1), row("a", 2), row("b", 3)).
		publish(2, "r1", 1, 150).publish(1, "r1", 1, 160).publish(1, "r1", 1, 200)
	s.h.Published[2], s.h.Published[0] = s.h.Published[0], s.h.Published[2]
	r := check(t, s, history.Rules{QuietFrom: tick(0), Bound: 155 * time.Millisecond})
	want(t, r, "a", []int64{2, 1}, history.Reordered, history.Late, history.Lost)
}

func TestEmptyHistoryIsAnError(t *testing.T) {
	if _, err := history.Check(history.History{}, history.Rules{}); !errors.Is(err, history.ErrEmpty) {
		t.Fatalf("Check(empty) = %v, want ErrEmpty", err)
	}
}
