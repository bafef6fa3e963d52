package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/outboxsql"
)

// A worker's round, in [worker.round] from top to bottom (one transaction
// per round, one round trip per step; the statements are in
// internal/outboxsql):
//
//  1. lease: every LeaseTTL/10, take or give up partitions (lease.go).
//  2. fence and scan, pipelined: lock the worker's lease rows FOR KEY
//     SHARE and read their tokens and gens; read the horizon (below); then
//     up to BatchSize rows from the unkeyed rows (partition -1) and the
//     worker's partitions, taking the partitions in turn, each in seq
//     order from its cursor, through the outbox's (partition, seq) index
//     (a worker that owns every partition reads the primary key in seq
//     order instead: neighbouring rows are cheaper to read). Keyed rows
//     are read without a lock, so a row that another session holds (an
//     operator's SELECT ... FOR UPDATE or UPDATE, a stale owner) is in the
//     window; due unkeyed rows are locked, SKIP LOCKED, as they are read
//     (shared by all workers, they are left to whoever holds them), except
//     by a worker that owns every partition, whose claim locks them. If the
//     leases are not the ones the worker believed it owned, it rolls back
//     and starts over.
//  3. pick, without the database: walking the window, a due unkeyed row
//     is taken; a keyed row is taken unless its key is blocked; a row that
//     is not due blocks its key (its followers wait behind it) and is
//     remembered as a place to come back to. A key is a key on
//     one destination, unless Config.GlobalKeyOrder. The owner is the only
//     one who claims or moves the rows of its keys (whoever else moves
//     them bumps the lease's gen first), so what it saw, claimed and put
//     back is the truth about its keys.
//  4. claim: lock the picked rows, SKIP LOCKED, delete them, RETURNING
//     them, unless the gens moved since step 2 (then nothing: the next
//     round reads the partitions again). A keyed row another session holds
//     does not come back: it blocks its key like a row that is not due,
//     and the rows of its key after it go back unpublished.
//  5. publish the claimed rows through the Sink, as copies.
//  6. decide, without the database, what becomes of each row: delivered,
//     put back (same seq, so the same place in its key's order, and its
//     key blocked until it is due) or buried in the dead letters.
//  7. settle: apply the decision and commit in one round trip.
//  8. move the cursors past the window.
//
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
//
// A relay that dies rolls back: its rows and lease rows are free at once,
// its partitions are taken once its workers' rows expire.

type worker struct {
	r      *Relay
	id     uuid.UUID
	leases []lease // the partitions this worker owns, by part
	live   int     // live workers at the last rebalance
	stuck  bool    // the last rebalance could not give up every extra partition

	rebalanceAt time.Time
	cursors     map[int32]int64 // per partition (-1: unkeyed), the seq to scan from
	next        int32           // the partition the next scan starts with
	lastFull    time.Time
	blocked     map[int64]bool // order ids whose head is behind the cursor, not taken
	back        rewind         // where the rows left behind are

	horizon    int64    // every seq up to this one is settled
	late       int64    // the horizon+1 a cursor passed; 0: none did
	seen       int64    // the highest seq scanned
	pendingTop int64    // a candidate horizon, once pending have ended
	pending    []string // virtual transaction ids; nil: no candidate
	seqs       sequenceWatch
	marked     map[int32]int64 // partition -> lease token whose Watermarker watermark was applied
}

// rewind is the lowest seq of the rows the worker left behind the cursor
// (not due, put back, parked, held by another session) and when the first
// of them is due (zero: never, they are parked).
type rewind struct {
	seq int64 // 0: none
	at  time.Time
}

// add notes a row left behind, due in wait microseconds (negative: parked).
func (b *rewind) add(seq, wait int64) {
	if b.seq == 0 || seq < b.seq {
		b.seq = seq
	}
	if wait >= 0 {
		at := time.Now().Add(time.Duration(wait) * time.Microsecond)
		if b.at.IsZero() || at.Before(b.at) {
			b.at = at
		}
	}
}

// restart makes the next scan start from the beginning, forgetting what
// the worker knew about its keys.
func (w *worker) restart() {
	w.cursors = map[int32]int64{}
	w.blocked = map[int64]bool{}
	w.back = rewind{}
	w.late = 0
}

// scanned is one row of a scan window.
type scanned struct {
	part  int32
	seq   int64
	ctid  pgtype.TID
	order int64 // the order id of its key (0: unkeyed)
	wait  int64 // microseconds until due; 0: due, -1: parked
}

// row is a claimed outbox row: the message as stored, for putting it back
// or burying it, whatever the Sink did to its copy.
type row struct {
	seq     int64
	msg     Message
	headers []byte // the stored JSON, nil for none
}

// claimTx is the round's transaction on its own connection: BEGIN is
// pipelined with the scan, so pgx's Tx is not used.
type claimTx struct {
	conn *pgxpool.Conn
	open bool
}

func (t *claimTx) rollback(ctx context.Context) {
	if t.open {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = t.conn.Exec(rctx, "ROLLBACK")
		t.open = false
	}
}

// round goes once through the steps above. It returns the number of rows
// claimed and whether to go on at once: the window was full and the cursor
// moved, or the leases changed.
func (w *worker) round(ctx, work context.Context) (int, bool, error) {
	r := w.r
	// 1. Lease.
	if !time.Now().Before(w.rebalanceAt) {
		if err := w.rebalance(ctx); err != nil {
			return 0, false, err
		}
	}
	w.rewindDue()
	if err := w.watermarks(ctx); err != nil {
		return 0, false, err
	}

	// 2. Fence and scan.
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return 0, false, err
	}
	defer conn.Release()
	tx := &claimTx{conn: conn}
	defer tx.rollback(ctx)
	held, win, err := w.scan(ctx, tx)
	if err != nil {
		return 0, false, fmt.Errorf("relay: scan: %w", err)
	}
	if w.seqs.moved {
		// The window was read from where the worker was before: it may
		// hold rows of the sequence's new run ahead of earlier ones.
		if err := w.checkSequence(ctx, tx); err != nil {
			return 0, false, err
		}
		return 0, true, nil
	}
	if !slices.Equal(held, w.leases) {
		tx.rollback(ctx)
		w.setLeases(held)
		return 0, true, nil
	}

	// 3. Pick; 4. claim.
	picked := w.pick(win)
	sent := time.Now() // the fence runs from here (see lease.go)
	rows, behind, err := w.claim(ctx, tx, picked)
	if err != nil {
		return 0, false, fmt.Errorf("relay: claim: %w", err)
	}

	// 5. Publish; 6. decide.
	var d decision
	var took time.Duration
	if len(rows) > 0 {
		var failed map[int]error
		pctx, fenced, err := r.fence(work, sent)
		if err != nil {
			return 0, false, err
		}
		pctx = withBatch(pctx)
		failed, took = r.publish(pctx, rows, behind)
		w.unmark(rows, failed)
		if err := fenced(); err != nil {
			return 0, false, err
		}
		if work.Err() != nil {
			// Shutdown grace is over: release the rows for the next relay
			// without counting an attempt.
			return 0, false, nil
		}
		d = decide(rows, failed, r.policy())
		for _, e := range d.failed {
			if h := r.cfg.Hooks.OnFailed; h != nil {
				h(e)
			}
		}
	}

	// 7. Settle.
	if err := r.commit(work, tx, d); err != nil {
		return 0, false, fmt.Errorf("relay: settle and commit: %w", err)
	}
	w.settled(d, picked)
	r.claimedRows(len(rows))
	r.report(d, took)

	// 8. Move on.
	moved := w.move(win)
	more := len(win) >= r.cfg.BatchSize && moved
	if len(w.leases) > w.target() && !w.stuck && time.Now().Before(w.rebalanceAt) {
		w.rebalanceAt = time.Time{} // give up the extra partitions now
	}
	return len(rows), more, nil
}

// rewindDue starts from the beginning every RescanInterval, and moves the
// cursors back to the rows left behind once the first of them is due.
func (w *worker) rewindDue() {
	switch now := time.Now(); {
	case now.Sub(w.lastFull) >= w.r.cfg.RescanInterval:
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

// scan begins the transaction, locks the worker's lease rows, moves the
// horizon and reads a window of rows, locking those it can take, then the
// file nodes of the table and its sequence (see sequence.go). It returns
// the leases as locked.
func (w *worker) scan(ctx context.Context, tx *claimTx) ([]lease, []scanned, error) {
	r := w.r
	idle := strconv.FormatInt(r.fenceTimeout().Milliseconds(), 10)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// Generic plans: the statements are the same every time and custom
	// planning costs as much as executing them. No sequential scans: a
	// generic plan made while the outbox was empty would keep scanning
	// it whole once it is not. No JIT: the penalty that keeps sequential
	// scans out (and a small lease table has no other path) would set it
	// off, for statements that take microseconds.
	b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)`, idle)
	b.Queue(r.sql.Hold, w.id)
	// The horizon needs moving only while scans reach it (or the sequence
	// is due for a check, see sequence.go).
	horizon := w.pending != nil || w.horizon <= w.seen || w.seqs.due()
	if horizon {
		b.Queue(r.sql.Lock)
		b.Queue(r.sql.Top, r.seqOID, r.sql.Table)
		b.Queue(r.sql.Writers, r.sql.Table, w.pending)
	}
	// Behind the cursors that passed the horizon, the scan looks for rows
	// that committed since, of keys that are not blocked.
	parts := w.partitions()
	starts, cursors := make([]int64, len(parts)), make([]int64, len(parts))
	for i, p := range parts {
		cursors[i] = w.cursors[p]
		starts[i] = cursors[i]
		if w.late != 0 {
			starts[i] = min(starts[i], w.late)
		}
	}
	blocked := []int64{}
	if w.late != 0 {
		blocked = slices.AppendSeq(make([]int64, 0, len(w.blocked)), maps.Keys(w.blocked))
	}
	if w.ownsAll() {
		// The cursors are all the same (see move).
		b.Queue(r.sql.ScanAll, r.cfg.BatchSize, slices.Min(starts), slices.Min(cursors), r.cfg.GlobalKeyOrder, blocked)
	} else {
		b.Queue(r.sql.Scan, r.cfg.BatchSize, parts, starts, cursors, r.cfg.GlobalKeyOrder, blocked)
	}
	b.Queue(r.sql.Nodes, r.seqOID, r.sql.Table)
	tx.open = true
	br := tx.conn.SendBatch(ctx, b)
	var held []lease
	var win []scanned
	err := func() error {
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		held, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (lease, error) {
			var l lease
			err := row.Scan(&l.part, &l.token, &l.gen)
			return l, err
		})
		if err != nil {
			return err
		}
		if horizon {
			if _, err := br.Exec(); err != nil {
				return err
			}
			var top, node, cache, seqNode int64
			if err := br.QueryRow().Scan(&top, &node, &cache, &seqNode); err != nil {
				return err
			}
			if err := w.watchSequence(top, node, cache, seqNode); err != nil {
				return err
			}
			var writers []string
			var ended bool
			if err := br.QueryRow().Scan(&writers, &ended); err != nil {
				return err
			}
			w.advance(top, writers, ended)
		}
		rows, err = br.Query()
		if err != nil {
			return err
		}
		win = make([]scanned, 0, r.cfg.BatchSize)
		var s scanned
		if _, err = pgx.ForEachRow(rows, []any{&s.part, &s.seq, &s.ctid, &s.order, &s.wait}, func() error {
			win = append(win, s)
			return nil
		}); err != nil {
			return err
		}
		var node, seqNode int64
		if err := br.QueryRow().Scan(&node, &seqNode); err != nil {
			return err
		}
		w.watch(w.seqs.high, node, seqNode)
		return nil
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return held, win, err
}

// move moves the cursors of the partitions in the window past their last
// row, and makes the next scan start after the window's last partition, so
// that every partition gets its turn. Once the horizon has reached the
// seq where a cursor first passed it, every cursor goes back there, to
// find the rows of transactions that committed late; a cursor that passes
// the horizon again marks the new place. It reports whether a cursor
// moved forward.
func (w *worker) move(win []scanned) bool {
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
	if w.ownsAll() {
		// The scan read every partition up to its last row.
		c := w.cursors[-1]
		for _, s := range win {
			c = max(c, s.seq+1)
		}
		for _, p := range w.partitions() {
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

// ownsAll reports whether the worker owns every partition: its scans then
// read the whole outbox in seq order (ScanAll), with one cursor.
func (w *worker) ownsAll() bool { return len(w.leases) == outboxsql.Partitions }

// advance moves the horizon: the candidate becomes it once the transactions
// that could write to the outbox when it was read have ended; a new
// candidate is the sequence's value top, read before the writers were.
func (w *worker) advance(top int64, writers []string, ended bool) {
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

// pick walks the window and returns the rows to claim.
func (w *worker) pick(win []scanned) (picked []scanned) {
	for _, s := range win {
		switch {
		case s.order == 0:
			if s.wait != 0 {
				w.back.add(s.seq, s.wait)
				continue
			}
		case w.blocked[s.order]:
			// It comes back with its key's head (a scan after the horizon
			// moved may read it before the head).
			w.back.add(s.seq, -1)
			continue
		case s.wait != 0:
			w.blocked[s.order] = true
			w.back.add(s.seq, s.wait)
			continue
		}
		picked = append(picked, s)
	}
	return picked
}

// claim locks, deletes and returns the picked rows, in seq order, and the
// rows among them that must not be published. A keyed row that does not
// come back is held by another session (an operator, a stale owner), or,
// with ParkFollowers, its key has a dead letter, or the gens moved since
// the scan (then none comes back, and the next round reads the partitions
// again): it stays its key's head, the worker looks at it again after a
// poll interval, and the rows of its key after it that came back go back
// unpublished.
func (w *worker) claim(ctx context.Context, tx *claimTx, picked []scanned) ([]row, map[int]error, error) {
	if len(picked) == 0 {
		return nil, nil, nil
	}
	r := w.r
	ctids := make([]pgtype.TID, len(picked))
	keyed := false
	for i, s := range picked {
		ctids[i] = s.ctid
		keyed = keyed || s.order != 0
	}
	parts := make([]int32, len(w.leases))
	gens := make([]int64, len(w.leases))
	for i, l := range w.leases {
		parts[i], gens[i] = l.part, l.gen
	}
	args := []any{ctids, parts, gens}
	stmt := r.sql.Claim
	if r.cfg.ParkFollowers && keyed {
		stmt = r.sql.ClaimParked
		args = append(args, r.cfg.GlobalKeyOrder)
	}
	rs, err := tx.conn.Query(ctx, stmt, args...)
	if err != nil {
		return nil, nil, err
	}
	rows := make([]row, 0, len(picked))
	var c row
	// pgtype's UUID decodes the binary value in place; uuid.UUID would go
	// through database/sql's Scanner (formatted as text, then parsed), and
	// a *string key costs an allocation per row.
	var id pgtype.UUID
	var key pgtype.Text
	_, err = pgx.ForEachRow(rs, []any{&c.seq, &id, &c.msg.Destination, &key, &c.msg.Payload, &c.headers, &c.msg.Attempts, &c.msg.CreatedAt}, func() error {
		c.msg.ID, c.msg.Key = id.Bytes, key.String
		rows = append(rows, c)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	// Both in seq order, the claimed rows are matched to what the scan
	// read by walking them side by side.
	bySeq := func(a, b scanned) int { return cmp.Compare(a.seq, b.seq) }
	if !slices.IsSortedFunc(picked, bySeq) {
		picked = slices.Clone(picked)
		slices.SortFunc(picked, bySeq)
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.seq, b.seq) })
	var behind map[int]error
	order := make([]int64, len(rows)) // per claimed row, its order id
	j := 0
	for i := range rows {
		c := &rows[i]
		for j < len(picked) && picked[j].seq < c.seq {
			j++
		}
		var part int32
		if j < len(picked) && picked[j].seq == c.seq {
			part, order[i] = picked[j].part, picked[j].order
			j++
		} else {
			// The row the scan read at this ctid was deleted since, and
			// another took its place: it goes back as it was.
			if behind == nil {
				behind = map[int]error{}
			}
			behind[i] = fmt.Errorf("%w (claimed by mistake)", ErrSkipped)
		}
		c.msg.Seq, c.msg.Partition, c.msg.LeaseToken = c.seq, int(part), w.token(part)
	}
	if len(rows) == len(picked) && behind == nil {
		return rows, nil, nil
	}
	poll := r.cfg.PollInterval
	head := map[int64]int64{} // order id -> lowest seq missing
	i := 0
	for _, s := range picked {
		for i < len(rows) && rows[i].seq < s.seq {
			i++
		}
		switch {
		case i < len(rows) && rows[i].seq == s.seq:
			continue
		case s.order == 0:
			// Held by another session (only a worker that owns every
			// partition reads unkeyed rows without locking them).
			w.back.add(s.seq, poll.Microseconds())
			continue
		}
		if h, ok := head[s.order]; !ok || s.seq < h {
			head[s.order] = s.seq
		}
		w.blocked[s.order] = true
		w.back.add(s.seq, poll.Microseconds())
	}
	for i, c := range rows {
		if h, ok := head[order[i]]; ok && c.seq > h {
			if behind == nil {
				behind = map[int]error{}
			}
			behind[i] = idemq.RetryAfter(fmt.Errorf("%w (it is locked by another session)", ErrSkipped), poll)
		}
	}
	return rows, behind, nil
}

// settled blocks the keys of the rows a committed batch put back or buried
// (behind a parked dead letter) and notes where the rows are.
func (w *worker) settled(d decision, picked []scanned) {
	if len(d.back.seqs) == 0 && len(d.parkKeys) == 0 {
		return
	}
	order := make(map[int64]int64, len(picked))
	for _, s := range picked {
		order[s.seq] = s.order
	}
	for i, seq := range d.back.seqs {
		if o := order[seq]; o != 0 {
			w.blocked[o] = true
		}
		w.back.add(seq, max(d.back.delays[i], -1))
	}
	for _, seq := range d.parkSeqs {
		w.blocked[order[seq]] = true
	}
}

// publish hands copies of the rows to the Sink, in ctx (see fence), except
// those failed beforehand (behind, by index) and their key's followers,
// and returns the failed indexes and the duration of the call. A row whose
// stored headers do not decode fails permanently on its own, and its key's
// followers with it.
func (r *Relay) publish(ctx context.Context, rows []row, behind map[int]error) (map[int]error, time.Duration) {
	msgs := make([]Message, len(rows))
	f := NewFailures(msgs)
	send := make([]int, 0, len(rows))
	for i, c := range rows {
		msgs[i] = c.msg
		if err := behind[i]; err != nil {
			f.Fail(i, err)
			continue
		}
		msgs[i].Payload = slices.Clone(c.msg.Payload)
		h, err := outboxsql.DecodeHeaders(c.headers)
		if err != nil {
			f.Fail(i, idemq.Permanent(fmt.Errorf("relay: stored %w", err)))
			continue
		}
		msgs[i].Headers = h
		if !f.Skip(i) {
			send = append(send, i)
		}
	}
	if len(send) == 0 {
		return f.failed, 0
	}
	batch := msgs
	if len(send) < len(msgs) {
		batch = make([]Message, len(send))
		for j, i := range send {
			batch[j] = msgs[i]
		}
	}
	start := time.Now()
	f.Merge(send, publish(ctx, r.sink, batch))
	return f.failed, time.Since(start)
}

// settlePolicy is what decide needs from the configuration.
type settlePolicy struct {
	retry  idemq.Retry
	park   bool
	global bool // Config.GlobalKeyOrder
}

func (r *Relay) policy() settlePolicy {
	return settlePolicy{retry: r.cfg.Retry, park: r.cfg.ParkFollowers, global: r.cfg.GlobalKeyOrder}
}

// orderKey is what a message's order is kept by: its key on its
// destination, or its key alone with Config.GlobalKeyOrder; "" for none.
func (p settlePolicy) orderKey(m Message) string {
	if m.Key == "" || p.global {
		return m.Key
	}
	return m.Destination + "\x00" + m.Key
}

// decision is what becomes of a claimed batch.
type decision struct {
	back, dead rowSet // put back, buried
	// parkKeys and parkDests (nil: every destination) are the keys whose
	// followers wait behind a dead letter, parkSeqs the dead letters.
	parkKeys  []string
	parkDests []*string
	parkSeqs  []int64
	delivered []Message
	failed    []FailedEvent // attempted and failed
	held      []HeldEvent
	skipped   []SkippedEvent
	retried   []RetriedEvent
	buried    []DeadLetteredEvent
}

// parkDelay marks rows put back with available_at = infinity (a negative
// delay in microseconds).
const parkDelay = -time.Microsecond

// decide settles every claimed row, without the database: a row that did
// not fail was delivered; a failed one is put back with a backoff delay
// (attempts + 1) or, after its last attempt or a permanent error, buried.
// Rows held behind an earlier failed row of their key go back with that
// row's delay and no attempt; rows a Sink skipped (ErrSkipped) go back
// without an attempt, due at once or after the Sink's RetryAfter hint.
func decide(rows []row, failed map[int]error, p settlePolicy) decision {
	var d decision
	blocked := map[string]time.Duration{} // order key -> delay of its failed head
	for i, c := range rows {
		m := c.msg
		err := failed[i]
		if err == nil {
			d.delivered = append(d.delivered, m)
			continue
		}
		k := p.orderKey(m)
		delay, isBlocked := blocked[k]
		isBlocked = isBlocked && k != ""
		permanent := idemq.IsPermanent(err)
		hold, _ := idemq.RetryAfterHint(err)
		switch {
		case permanent || !errors.Is(err, ErrSkipped):
			d.failed = append(d.failed, FailedEvent{Message: m, Err: err})
		case !isBlocked && hold > 0:
			d.held = append(d.held, HeldEvent{Message: m, Err: err, Delay: hold})
		default:
			d.skipped = append(d.skipped, SkippedEvent{Message: m, Err: err})
		}
		switch {
		case isBlocked && !permanent:
			// Held behind an earlier row of its key: not an attempt.
			d.back.add(c, m.Attempts, delay, err)
			continue
		case !isBlocked && errors.Is(err, ErrSkipped) && !permanent:
			// Skipped behind a row that became a dead letter: again now; or
			// held by the Sink (ErrSkipped with a RetryAfter hint): again
			// then, its key's followers behind it. Not an attempt.
			d.back.add(c, m.Attempts, hold, err)
			if k != "" && hold > 0 {
				blocked[k] = hold
			}
			continue
		}
		attempts := m.Attempts + 1
		if permanent || attempts >= p.retry.MaxAttempts {
			d.dead.add(c, attempts, 0, err)
			m.Attempts = attempts
			d.buried = append(d.buried, DeadLetteredEvent{Message: m, Err: err})
			if p.park && k != "" {
				blocked[k] = parkDelay
				var dest *string
				if !p.global {
					dest = &m.Destination
				}
				d.parkKeys = append(d.parkKeys, m.Key)
				d.parkDests = append(d.parkDests, dest)
				d.parkSeqs = append(d.parkSeqs, c.seq)
			}
			continue
		}
		hint, _ := idemq.RetryAfterHint(err)
		delay = p.retry.Delay(attempts, hint)
		d.back.add(c, attempts, delay, err)
		d.retried = append(d.retried, RetriedEvent{Message: m, Err: err, Delay: delay})
		if k != "" {
			blocked[k] = delay
		}
	}
	return d
}

// commit applies d and commits, in one round trip.
func (r *Relay) commit(ctx context.Context, tx *claimTx, d decision) error {
	b := &pgx.Batch{}
	if len(d.back.seqs) > 0 {
		s := d.back
		b.Queue(r.sql.PutBack, s.seqs, s.ids, s.created, s.delays, s.attempts, s.dests, s.payloads, s.keys, s.headers, s.errs)
	}
	if len(d.dead.seqs) > 0 {
		s := d.dead
		b.Queue(r.sql.Bury, s.seqs, s.ids, s.created, s.attempts, s.dests, s.payloads, s.keys, s.headers, s.errs, errclass.All(s.errs))
	}
	if len(d.parkKeys) > 0 {
		b.Queue(r.sql.Park, d.parkKeys, d.parkDests)
	}
	b.Queue("COMMIT")
	if err := tx.conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	tx.open = false
	return nil
}

// rowSet accumulates rows for the array statements.
type rowSet struct {
	seqs     []int64
	ids      []uuid.UUID
	created  []time.Time
	delays   []int64
	attempts []int32
	dests    []string
	payloads [][]byte
	keys     []*string
	headers  []*string
	errs     []string
}

func (s *rowSet) add(c row, attempts int, delay time.Duration, cause error) {
	m := c.msg
	s.seqs = append(s.seqs, c.seq)
	s.ids = append(s.ids, m.ID)
	s.created = append(s.created, m.CreatedAt)
	s.delays = append(s.delays, delay.Microseconds())
	s.attempts = append(s.attempts, int32(attempts))
	s.dests = append(s.dests, m.Destination)
	s.payloads = append(s.payloads, m.Payload)
	var key, headers *string
	if m.Key != "" {
		key = &m.Key
	}
	if c.headers != nil {
		h := string(c.headers)
		headers = &h
	}
	s.keys = append(s.keys, key)
	s.headers = append(s.headers, headers)
	s.errs = append(s.errs, errorText(cause))
}

// errorText makes an error storable in a text column: errtext's rule, and
// no NUL, which Postgres text refuses.
func errorText(err error) string {
	return strings.ReplaceAll(errtext.Of(err), "\x00", "")
}
