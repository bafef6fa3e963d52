package relay

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemq/idemq"
)

// The cursors: the next scan of a partition starts after the last row this
// one read from it, so no scan reads again through what was deleted (dead
// index entries that a long-running transaction elsewhere keeps visible).
// They move back to a row the worker left behind once that row is due, to
// the start after a lease change and every RescanInterval, and to the
// horizon when it moves past where they were. The horizon is the highest
// seq such that every transaction that could have drawn a seq up to it has
// ended: the sequence's last value, once every transaction that held the
// outbox's RowExclusiveLock when it was read (taken before any seq is
// drawn) is gone. A transaction that drew a seq may commit after later
// seqs did: the cursors go past the horizon (so that rows that are not due
// or blocked never stop the rows after them, however long a writer stays
// open), and once the horizon moves the worker reads again from where the
// first cursor passed it, finding the rows that committed late.
// Transactions that never wrote to the outbox do not hold it back.

// window is what a worker knows of its partitions between rounds: where
// each scan starts, which keys wait behind a row it left behind, and the
// horizon. It does no I/O: the worker's round reads the database and
// tells it what it read, claimed and settled, and it answers where to
// read next and which rows to take.
type window struct {
	cursors  map[int32]int64 // per partition (-1: unkeyed), the seq to scan from
	next     int32           // the partition the next scan starts with
	lastFull time.Time       // the last restart
	blocked  map[int64]bool  // order ids whose head is behind the cursor, not taken
	back     rewind          // where the rows left behind are

	horizon    int64    // every seq up to this one is settled
	late       int64    // the horizon+1 a cursor passed; 0: none did
	seen       int64    // the highest seq scanned
	pendingTop int64    // a candidate horizon, once pending have ended
	pending    []string // virtual transaction ids; nil: no candidate
}

// newWindow returns the window of a worker that starts at now.
func newWindow(now time.Time) *window {
	w := &window{lastFull: now}
	w.restart()
	return w
}

// scanned is one row of a scan window.
type scanned struct {
	part  int32
	seq   int64
	ctid  pgtype.TID
	order int64 // the order id of its key (0: unkeyed)
	wait  int64 // microseconds until due; 0: due, -1: parked
}

// rewind is the lowest seq of the rows the worker left behind the cursor
// (not due, put back, parked, held by another session) and when the first
// of them is due (zero: never, they are parked).
type rewind struct {
	seq int64 // 0: none
	at  time.Time
}

// add notes a row left behind at now, due in wait microseconds (negative:
// parked).
func (b *rewind) add(seq, wait int64, now time.Time) {
	if b.seq == 0 || seq < b.seq {
		b.seq = seq
	}
	if wait >= 0 {
		at := now.Add(time.Duration(wait) * time.Microsecond)
		if b.at.IsZero() || at.Before(b.at) {
			b.at = at
		}
	}
}

// restart makes the next scan start from the beginning, forgetting what
// the worker knew about its keys.
func (w *window) restart() {
	w.cursors = map[int32]int64{}
	w.blocked = map[int64]bool{}
	w.back = rewind{}
	w.late = 0
}

// reset forgets the horizon too: the sequence restarted or the table was
// rewritten, and what the window knew of the seqs may lie ahead of every
// new row.
func (w *window) reset() {
	w.restart()
	w.horizon, w.seen, w.pending = 0, 0, nil
}

// rewindDue starts from the beginning every rescan, and moves the cursors
// back to the rows left behind once the first of them is due.
func (w *window) rewindDue(now time.Time, rescan time.Duration) {
	switch {
	case now.Sub(w.lastFull) >= rescan:
		w.restart()
		w.lastFull = now
	case !w.back.at.IsZero() && !now.Before(w.back.at):
		for p, c := range w.cursors {
			w.cursors[p] = min(c, w.back.seq)
		}
		w.blocked = map[int64]bool{}
		w.back = rewind{}
	}
}

// needsHorizon reports whether the next scan should move the horizon: a
// candidate waits, or the scans reached it.
func (w *window) needsHorizon() bool {
	return w.pending != nil || w.horizon <= w.seen
}

// from returns where the next scan of parts starts (starts) and where its
// cursors are (cursors), and the keys it skips behind the cursors: behind
// the cursors that passed the horizon, the scan looks for rows that
// committed since, of keys that are not blocked.
func (w *window) from(parts []int32) (starts, cursors, blocked []int64) {
	starts, cursors = make([]int64, len(parts)), make([]int64, len(parts))
	for i, p := range parts {
		cursors[i] = w.cursors[p]
		starts[i] = cursors[i]
		if w.late != 0 {
			starts[i] = min(starts[i], w.late)
		}
	}
	blocked = []int64{}
	if w.late != 0 {
		blocked = slices.AppendSeq(make([]int64, 0, len(w.blocked)), maps.Keys(w.blocked))
	}
	return starts, cursors, blocked
}

// advance moves the horizon: the candidate becomes it once the transactions
// that could write to the outbox when it was read have ended; a new
// candidate is the sequence's value top, read before the writers were.
func (w *window) advance(top int64, writers []string, ended bool) {
	if w.pending != nil && ended {
		w.horizon = max(w.horizon, w.pendingTop)
		w.pending = nil
	}
	if w.pending == nil {
		if len(writers) == 0 {
			w.horizon = max(w.horizon, top)
		} else {
			w.pendingTop, w.pending = top, writers
		}
	}
}

// pick walks the window read at now and returns the rows to claim: a due
// unkeyed row; a keyed row unless its key is blocked. A row that is not due
// blocks its key (its followers wait behind it) and is remembered as a
// place to come back to.
func (w *window) pick(win []scanned, now time.Time) (picked []scanned) {
	for _, s := range win {
		switch {
		case s.order == 0:
			if s.wait != 0 {
				w.back.add(s.seq, s.wait, now)
				continue
			}
		case w.blocked[s.order]:
			// It comes back with its key's head (a scan after the horizon
			// moved may read it before the head).
			w.back.add(s.seq, -1, now)
			continue
		case s.wait != 0:
			w.blocked[s.order] = true
			w.back.add(s.seq, s.wait, now)
			continue
		}
		picked = append(picked, s)
	}
	return picked
}

// claimed matches the rows a claim returned (seqs, in seq order) to the
// picked rows, at now: parts holds each claimed row's partition, and
// behind the claimed rows that must not be published. A claimed seq that
// was not picked is a row that took the place of a deleted one (it goes
// back as it was). A keyed row that was picked and did not come back is
// held by another session or parked: it stays its key's head, blocks its
// key, is looked at again after poll, and the rows of its key after it
// that came back go back unpublished. An unkeyed one is looked at again
// after poll.
func (w *window) claimed(picked []scanned, seqs []int64, poll time.Duration, now time.Time) (parts []int32, behind map[int]error) {
	bySeq := func(a, b scanned) int { return cmp.Compare(a.seq, b.seq) }
	if !slices.IsSortedFunc(picked, bySeq) {
		picked = slices.Clone(picked)
		slices.SortFunc(picked, bySeq)
	}
	fail := func(i int, err error) {
		if behind == nil {
			behind = map[int]error{}
		}
		behind[i] = err
	}
	parts = make([]int32, len(seqs))
	order := make([]int64, len(seqs)) // per claimed row, its order id
	j := 0
	for i, seq := range seqs {
		for j < len(picked) && picked[j].seq < seq {
			j++
		}
		if j < len(picked) && picked[j].seq == seq {
			parts[i], order[i] = picked[j].part, picked[j].order
			j++
			continue
		}
		fail(i, fmt.Errorf("%w (claimed by mistake)", ErrSkipped))
	}
	if len(seqs) == len(picked) && behind == nil {
		return parts, nil
	}
	head := map[int64]int64{} // order id -> lowest seq missing
	i := 0
	for _, s := range picked {
		for i < len(seqs) && seqs[i] < s.seq {
			i++
		}
		switch {
		case i < len(seqs) && seqs[i] == s.seq:
			continue
		case s.order == 0:
			// Held by another session (only a worker that owns every
			// partition reads unkeyed rows without locking them).
			w.back.add(s.seq, poll.Microseconds(), now)
			continue
		}
		if h, ok := head[s.order]; !ok || s.seq < h {
			head[s.order] = s.seq
		}
		w.blocked[s.order] = true
		w.back.add(s.seq, poll.Microseconds(), now)
	}
	for i, seq := range seqs {
		if h, ok := head[order[i]]; ok && seq > h {
			fail(i, idemq.RetryAfter(fmt.Errorf("%w (it is locked by another session)", ErrSkipped), poll))
		}
	}
	return parts, behind
}

// settled blocks the keys of the rows a committed batch put back (back,
// each due after its delay in microseconds, negative: parked) or buried
// behind a parked dead letter (park), and notes where the rows are.
func (w *window) settled(back, delays, park []int64, picked []scanned, now time.Time) {
	if len(back) == 0 && len(park) == 0 {
		return
	}
	order := make(map[int64]int64, len(picked))
	for _, s := range picked {
		order[s.seq] = s.order
	}
	for i, seq := range back {
		if o := order[seq]; o != 0 {
			w.blocked[o] = true
		}
		w.back.add(seq, max(delays[i], -1), now)
	}
	for _, seq := range park {
		w.blocked[order[seq]] = true
	}
}

// move moves the cursors of the partitions in the window past their last
// row, and makes the next scan start after the window's last partition, so
// that every partition gets its turn. With all (the worker owns every
// partition, parts) the scan read every partition up to its last row, so
// all cursors move there. Once the horizon has reached the seq where a
// cursor first passed it, every cursor goes back there, to find the rows
// of transactions that committed late; a cursor that passes the horizon
// again marks the new place. It reports whether a cursor moved forward.
func (w *window) move(win []scanned, all bool, parts []int32) bool {
	moved := false
	for _, s := range win {
		if s.seq >= w.cursors[s.part] {
			w.cursors[s.part] = s.seq + 1
			moved = true
		}
		w.seen = max(w.seen, s.seq)
	}
	if len(win) > 0 {
		w.next = win[len(win)-1].part + 1
	}
	if all {
		c := w.cursors[-1]
		for _, s := range win {
			c = max(c, s.seq+1)
		}
		for _, p := range parts {
			w.cursors[p] = max(w.cursors[p], c)
		}
	}
	if w.late != 0 && w.horizon >= w.late {
		for p, c := range w.cursors {
			w.cursors[p] = min(c, w.late)
		}
		w.late = 0
	}
	if w.late == 0 {
		for _, c := range w.cursors {
			if c > w.horizon+1 {
				w.late = w.horizon + 1
				break
			}
		}
	}
	return moved
}
