package relay

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/idemq/idemq"
)

// The window's decisions without a database: each case starts from a
// window's state, gives it what a round read, claimed or settled, and
// checks what it answers and the state it is left in.

var winT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// urow is an unkeyed row of a scan, krow a keyed one (order id), each of
// partition part, due after wait microseconds (0: due, -1: parked).
func urow(seq, wait int64) scanned { return scanned{part: -1, seq: seq, wait: wait} }
func krow(part int32, seq, order, wait int64) scanned {
	return scanned{part: part, seq: seq, order: order, wait: wait}
}

func seqsOf(rows []scanned) []int64 {
	out := make([]int64, len(rows))
	for i, s := range rows {
		out[i] = s.seq
	}
	return out
}

func TestWindowPick(t *testing.T) {
	for _, c := range []struct {
		name        string
		blocked     []int64 // blocked before
		win         []scanned
		picked      []int64
		wantBlocked []int64
		back        rewind
	}{
		{name: "everything due is taken", win: []scanned{urow(1, 0), krow(3, 2, 7, 0), krow(3, 3, 7, 0)}, picked: []int64{1, 2, 3}},
		{
			name: "an unkeyed row not due is left behind, blocking nothing",
			win:  []scanned{urow(1, 500), urow(2, 0)}, picked: []int64{2},
			back: rewind{seq: 1, at: winT0.Add(500 * time.Microsecond)},
		},
		{
			name: "a keyed row not due blocks its followers, not other keys",
			win:  []scanned{krow(3, 4, 7, 1000), krow(3, 5, 7, 0), krow(3, 6, 8, 0)}, picked: []int64{6},
			wantBlocked: []int64{7}, back: rewind{seq: 4, at: winT0.Add(time.Millisecond)},
		},
		{
			name:    "a blocked key's rows wait with its head, without a time of their own",
			blocked: []int64{7}, win: []scanned{krow(3, 9, 7, 0), krow(3, 10, 8, 0)}, picked: []int64{10},
			wantBlocked: []int64{7}, back: rewind{seq: 9},
		},
		{
			name: "a parked row blocks its key and is never due",
			win:  []scanned{krow(1, 2, 5, -1), krow(1, 3, 5, 0)}, picked: nil,
			wantBlocked: []int64{5}, back: rewind{seq: 2},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWindow(winT0)
			for _, o := range c.blocked {
				w.blocked[o] = true
			}
			picked := w.pick(c.win, winT0)
			if got := seqsOf(picked); !slices.Equal(got, c.picked) && len(got)+len(c.picked) > 0 {
				t.Errorf("picked %v, want %v", got, c.picked)
			}
			if got := slices.Sorted(maps.Keys(w.blocked)); !slices.Equal(got, c.wantBlocked) && len(got)+len(c.wantBlocked) > 0 {
				t.Errorf("blocked %v, want %v", got, c.wantBlocked)
			}
			if w.back != c.back {
				t.Errorf("back %+v, want %+v", w.back, c.back)
			}
		})
	}
}

func TestWindowClaimed(t *testing.T) {
	poll := 50 * time.Millisecond
	for _, c := range []struct {
		name        string
		picked      []scanned
		claimed     []int64
		parts       []int32
		behind      map[int]string // index -> "mistake" or "held"
		wantBlocked []int64
		back        rewind
	}{
		{
			name:   "every picked row came back",
			picked: []scanned{urow(1, 0), krow(4, 2, 9, 0)}, claimed: []int64{1, 2}, parts: []int32{-1, 4},
		},
		{
			name:   "a key's head held elsewhere: its key blocks, its follower goes back, another key goes on",
			picked: []scanned{krow(4, 2, 9, 0), krow(4, 3, 9, 0), krow(5, 4, 10, 0)}, claimed: []int64{3, 4}, parts: []int32{4, 5},
			behind: map[int]string{0: "held"}, wantBlocked: []int64{9}, back: rewind{seq: 2, at: winT0.Add(poll)},
		},
		{
			name:   "an unkeyed row held elsewhere is looked at again after a poll, blocking nothing",
			picked: []scanned{urow(1, 0), urow(2, 0)}, claimed: []int64{2}, parts: []int32{-1},
			back: rewind{seq: 1, at: winT0.Add(poll)},
		},
		{
			name:   "a row that took a deleted row's place goes back as it was",
			picked: []scanned{krow(4, 2, 9, 0)}, claimed: []int64{2, 8}, parts: []int32{4, 0},
			behind: map[int]string{1: "mistake"},
		},
		{
			name:   "picked out of seq order, matched in seq order",
			picked: []scanned{krow(6, 5, 3, 0), krow(4, 2, 9, 0)}, claimed: []int64{2, 5}, parts: []int32{4, 6},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWindow(winT0)
			parts, behind := w.claimed(c.picked, c.claimed, poll, winT0)
			if !slices.Equal(parts, c.parts) {
				t.Errorf("parts %v, want %v", parts, c.parts)
			}
			if len(behind) != len(c.behind) {
				t.Errorf("behind %v, want %v", behind, c.behind)
			}
			for i, kind := range c.behind {
				err := behind[i]
				hint, _ := idemq.RetryAfterHint(err)
				switch {
				case !errors.Is(err, ErrSkipped):
					t.Errorf("row %d: %v, want ErrSkipped", i, err)
				case kind == "held" && hint != poll:
					t.Errorf("row %d held behind its key's head: retry after %v, want %v", i, hint, poll)
				case kind == "mistake" && hint != 0:
					t.Errorf("row %d claimed by mistake: retry after %v, want at once", i, hint)
				}
			}
			if got := slices.Sorted(maps.Keys(w.blocked)); !slices.Equal(got, c.wantBlocked) && len(got)+len(c.wantBlocked) > 0 {
				t.Errorf("blocked %v, want %v", got, c.wantBlocked)
			}
			if w.back != c.back {
				t.Errorf("back %+v, want %+v", w.back, c.back)
			}
		})
	}
}

func TestWindowMove(t *testing.T) {
	all := append([]int32{-1}, func() []int32 {
		p := make([]int32, 64)
		for i := range p {
			p[i] = int32(i)
		}
		return p
	}()...)
	for _, c := range []struct {
		name          string
		cursors       map[int32]int64
		horizon, late int64
		win           []scanned
		all           bool
		moved         bool
		want          map[int32]int64 // cursors checked
		next          int32
		wantLate      int64
	}{
		{
			name: "each partition's cursor goes past its last row; the next scan starts after the last partition",
			win:  []scanned{urow(1, 0), krow(3, 2, 1, 0), krow(3, 5, 1, 0), krow(7, 4, 2, 0)}, horizon: 10,
			moved: true, want: map[int32]int64{-1: 2, 3: 6, 7: 5}, next: 8,
		},
		{
			name:    "an empty window moves nothing",
			cursors: map[int32]int64{3: 6}, horizon: 10, moved: false, want: map[int32]int64{3: 6},
		},
		{
			name: "a worker that owns every partition moves every cursor to the window's end",
			win:  []scanned{krow(3, 2, 1, 0), krow(9, 8, 2, 0)}, all: true, horizon: 20,
			moved: true, want: map[int32]int64{-1: 9, 0: 9, 3: 9, 9: 9, 63: 9}, next: 10,
		},
		{
			name: "a cursor past the horizon marks where the late rows may be",
			win:  []scanned{krow(3, 12, 1, 0)}, horizon: 10,
			moved: true, want: map[int32]int64{3: 13}, next: 4, wantLate: 11,
		},
		{
			name:    "once the horizon reached the mark, every cursor goes back to it",
			cursors: map[int32]int64{3: 13, 5: 20}, late: 11, horizon: 15,
			moved: false, want: map[int32]int64{3: 11, 5: 11}, wantLate: 0,
		},
		{
			name:    "the mark stays while the horizon is below it",
			cursors: map[int32]int64{3: 13}, late: 11, horizon: 10,
			want: map[int32]int64{3: 13}, wantLate: 11,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWindow(winT0)
			if c.cursors != nil {
				w.cursors = maps.Clone(c.cursors)
			}
			w.horizon, w.late = c.horizon, c.late
			if got := w.move(c.win, c.all, all); got != c.moved {
				t.Errorf("moved %v, want %v", got, c.moved)
			}
			for p, want := range c.want {
				if w.cursors[p] != want {
					t.Errorf("cursor of %d at %d, want %d (cursors %v)", p, w.cursors[p], want, w.cursors)
				}
			}
			if len(c.win) > 0 && w.next != c.next {
				t.Errorf("next %d, want %d", w.next, c.next)
			}
			if w.late != c.wantLate {
				t.Errorf("late %d, want %d", w.late, c.wantLate)
			}
		})
	}
}

func TestWindowAdvance(t *testing.T) {
	type read struct {
		top     int64
		writers []string
		ended   bool
	}
	for _, c := range []struct {
		name    string
		reads   []read
		horizon int64
		pending bool
	}{
		{name: "no writer: the horizon is the sequence's value", reads: []read{{top: 10}}, horizon: 10},
		{name: "writers open: a candidate waits for them", reads: []read{{top: 10, writers: []string{"3/7"}}}, horizon: 0, pending: true},
		{
			name:  "the writers ended: the candidate becomes the horizon, and a new read with no writer moves it on",
			reads: []read{{top: 10, writers: []string{"3/7"}}, {top: 14, ended: true}}, horizon: 14,
		},
		{
			name:  "the writers still open: the candidate keeps waiting, later values do not jump it",
			reads: []read{{top: 10, writers: []string{"3/7"}}, {top: 14}}, horizon: 0, pending: true,
		},
		{
			name:  "the horizon never goes back",
			reads: []read{{top: 10}, {top: 4}}, horizon: 10,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWindow(winT0)
			for _, r := range c.reads {
				w.advance(r.top, r.writers, r.ended)
			}
			if w.horizon != c.horizon || (w.pending != nil) != c.pending {
				t.Errorf("horizon %d pending %v, want %d pending %v", w.horizon, w.pending, c.horizon, c.pending)
			}
			if w.needsHorizon() != (c.pending || w.horizon <= w.seen) {
				t.Errorf("needsHorizon %v with pending %v", w.needsHorizon(), w.pending)
			}
		})
	}
}

func TestWindowRewindDue(t *testing.T) {
	rescan := time.Minute
	for _, c := range []struct {
		name    string
		at      time.Duration // now - winT0
		back    rewind
		cursors map[int32]int64
		blocked bool // still blocked after
	}{
		{name: "nothing due: the cursors stay", at: time.Second, back: rewind{seq: 5, at: winT0.Add(2 * time.Second)}, cursors: map[int32]int64{3: 20, 4: 30}, blocked: true},
		{name: "a row left behind is due: every cursor goes back to it, keys unblock", at: 2 * time.Second, back: rewind{seq: 5, at: winT0.Add(2 * time.Second)}, cursors: map[int32]int64{3: 5, 4: 5}},
		{name: "parked rows are never due", at: time.Second, back: rewind{seq: 5}, cursors: map[int32]int64{3: 20, 4: 30}, blocked: true},
		{name: "RescanInterval passed: from the start", at: rescan, back: rewind{seq: 5}, cursors: map[int32]int64{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWindow(winT0)
			w.cursors = map[int32]int64{3: 20, 4: 30}
			w.blocked[9] = true
			w.back = c.back
			w.rewindDue(winT0.Add(c.at), rescan)
			if !maps.Equal(w.cursors, c.cursors) {
				t.Errorf("cursors %v, want %v", w.cursors, c.cursors)
			}
			if w.blocked[9] != c.blocked {
				t.Errorf("key blocked %v, want %v", w.blocked[9], c.blocked)
			}
		})
	}
}

// TestWindowSettledAndFrom: a batch that put rows back and parked a key
// blocks both keys; once a cursor passed the horizon, the next scan reads
// from the mark and skips the blocked keys.
func TestWindowSettledAndFrom(t *testing.T) {
	w := newWindow(winT0)
	picked := []scanned{krow(3, 2, 7, 0), krow(3, 3, 8, 0), urow(4, 0)}
	w.settled([]int64{2, 4}, []int64{1000, 0}, []int64{3}, picked, winT0)
	if got := slices.Sorted(maps.Keys(w.blocked)); !slices.Equal(got, []int64{7, 8}) {
		t.Errorf("blocked %v, want the put-back key 7 and the parked key 8", got)
	}
	if want := (rewind{seq: 2, at: winT0}); w.back != want {
		t.Errorf("back %+v, want %+v", w.back, want)
	}
	starts, cursors, blocked := w.from([]int32{-1, 3})
	if !slices.Equal(starts, []int64{0, 0}) || !slices.Equal(cursors, []int64{0, 0}) || len(blocked) != 0 {
		t.Errorf("from before any mark: %v %v %v, want the cursors and no keys skipped", starts, cursors, blocked)
	}
	w.cursors = map[int32]int64{-1: 30, 3: 12}
	w.late = 11
	starts, cursors, blocked = w.from([]int32{-1, 3})
	slices.Sort(blocked)
	if !slices.Equal(starts, []int64{11, 11}) || !slices.Equal(cursors, []int64{30, 12}) || !slices.Equal(blocked, []int64{7, 8}) {
		t.Errorf("from after a mark: starts %v cursors %v skipping %v, want [11 11] [30 12] [7 8]", starts, cursors, blocked)
	}
}
