package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/outboxsql"
)

// How a batch is claimed (one transaction per batch, one round trip per
// step; the statements are in internal/outboxsql):
//
//  1. fence and scan, pipelined: lock the worker's lease rows FOR SHARE
//     and read their tokens and gens (see lease.go); read the horizon
//     (below); then up to BatchSize rows, FOR UPDATE SKIP LOCKED, from the
//     unkeyed rows (partition -1) and the worker's partitions, taking the
//     partitions in turn, each in seq order from its cursor, through the
//     outbox's (partition, seq) index (a worker that owns every
//     partition reads the primary key in seq order instead: neighbouring
//     rows are cheaper to read). Only unkeyed rows are ever locked
//     by another worker: a partition is scanned by its owner alone. If
//     the leases are not the ones the worker believed it owned, it rolls
//     back and starts over.
//  2. pick, without the database: walking the window in seq order, a due
//     unkeyed row is taken; a keyed row is taken unless its key is
//     blocked; a row that is not due blocks its key (its followers wait
//     behind it) and is remembered as a place to come back to when it is
//     due. The owner is the only one who claims or moves the rows of its
//     keys (whoever else moves them bumps the lease's gen first), so what
//     it saw, claimed and put back is the truth about its keys.
//  3. claim: delete the picked rows, RETURNING them.
//  4. publish the claimed rows through the Sink, as copies.
//  5. decide, without the database, what becomes of each row: delivered,
//     put back (same seq, so the same place in its key's order, and its
//     key blocked until it is due) or buried in the dead letters.
//  6. commit: apply the decision and commit in one round trip.
//
// The cursors: the next scan of a partition starts after the last row this
// one read from it, so no scan reads again through what was deleted (dead
// index entries that a long-running transaction elsewhere keeps visible).
// They move back to a row the worker left behind once that row is due, to
// the start after a lease change and every RescanInterval. And they never
// pass the horizon:
// a transaction that drew a seq may commit after later seqs did. The
// horizon is the highest seq such that every transaction that could have
// drawn a seq up to it has ended: the sequence's last value, once every
// transaction that held the outbox's RowExclusiveLock when it was read
// (taken before any seq is drawn) is gone. Transactions that never wrote
// to the outbox do not hold it back.
//
// A relay that dies rolls back: its rows and lease rows are free at once,
// its partitions are taken once its workers' rows expire.

type worker struct {
	r      *Relay
	id     uuid.UUID
	leases []lease // the partitions this worker owns, by part
	live   int     // live workers at the last rebalance

	rebalanceAt time.Time
	cursors     map[int32]int64 // per partition (-1: unkeyed), the seq to scan from
	next        int32           // the partition the next scan starts with
	lastFull    time.Time
	blocked     map[string]bool // keys whose head is behind the cursor, not due
	back        rewind          // where the rows left behind are

	horizon    int64    // every seq up to this one is settled
	seen       int64    // the highest seq scanned
	pendingTop int64    // a candidate horizon, once pending have ended
	pending    []string // virtual transaction ids; nil: no candidate
}

// rewind is the lowest seq of the rows the worker left behind the cursor
// (not due, put back, parked) and when the first of them is due (zero:
// never, they are parked).
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
	w.blocked = map[string]bool{}
	w.back = rewind{}
}

// scanned is one row of a scan window.
type scanned struct {
	part int32
	seq  int64
	ctid pgtype.TID
	key  *string
	wait int64 // microseconds until due; 0: due, -1: parked
}

// row is a claimed outbox row: the message as stored, for putting it back
// or burying it, whatever the Sink did to its copy.
type row struct {
	seq     int64
	msg     Message
	headers []byte // the stored JSON, nil for none
}

// claimTx is the batch's transaction on its own connection: BEGIN is
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

// batch claims, publishes and settles one batch. It returns the number of
// rows claimed and whether to go on at once: the window was full and the
// cursor moved, or the leases changed.
func (w *worker) batch(ctx, work context.Context) (int, bool, error) {
	r := w.r
	switch now := time.Now(); {
	case now.Sub(w.lastFull) >= r.cfg.RescanInterval:
		w.restart()
		w.lastFull = now
	case !w.back.at.IsZero() && !now.Before(w.back.at):
		for p, c := range w.cursors {
			w.cursors[p] = min(c, w.back.seq)
		}
		w.blocked = map[string]bool{}
		w.back = rewind{}
	}
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
	if !slices.Equal(held, w.leases) {
		tx.rollback(ctx)
		w.setLeases(held)
		return 0, true, nil
	}
	picked := w.pick(win)
	var rows []row
	if len(picked) > 0 {
		if rows, err = w.claim(ctx, tx, picked); err != nil {
			return 0, false, fmt.Errorf("relay: claim: %w", err)
		}
	}
	var d decision
	var took time.Duration
	if len(rows) > 0 {
		var failed map[int]error
		failed, took = r.publish(work, rows)
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
	if err := r.commit(work, tx, d); err != nil {
		return 0, false, fmt.Errorf("relay: settle and commit: %w", err)
	}
	w.settled(d)
	moved := w.move(win)
	r.claimedRows(len(rows))
	r.report(d, took)
	more := len(win) >= r.cfg.BatchSize && moved
	if len(w.leases) > w.target() && time.Now().Before(w.rebalanceAt) {
		w.rebalanceAt = time.Time{} // give up the extra partitions now
	}
	return len(rows), more, nil
}

// scan begins the transaction, locks the worker's lease rows, moves the
// horizon and locks a window of rows. It returns the leases as locked.
func (w *worker) scan(ctx context.Context, tx *claimTx) ([]lease, []scanned, error) {
	r := w.r
	idle := strconv.FormatInt((r.cfg.PublishTimeout + 10*time.Second).Milliseconds(), 10)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// Generic plans: the statements are the same every time and custom
	// planning costs as much as executing them. No sequential scans: a
	// generic plan made while the outbox was empty would keep scanning
	// it whole once it is not.
	b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true)`, idle)
	b.Queue(r.sql.Hold, w.id)
	// The horizon needs moving only while scans reach it.
	horizon := w.pending != nil || w.horizon <= w.seen
	if horizon {
		b.Queue(r.sql.Lock)
		b.Queue(r.sql.Top, r.seqOID)
		b.Queue(r.sql.Writers, r.sql.Table, w.pending)
	}
	parts := w.partitions()
	cursors := make([]int64, len(parts))
	for i, p := range parts {
		cursors[i] = w.cursors[p]
	}
	if w.ownsAll() {
		// The cursors are all the same (see move).
		b.Queue(r.sql.ScanAll, r.cfg.BatchSize, slices.Min(cursors))
	} else {
		b.Queue(r.sql.Scan, r.cfg.BatchSize, parts, cursors)
	}
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
			var top int64
			if err := br.QueryRow().Scan(&top); err != nil {
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
		win, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (scanned, error) {
			var s scanned
			err := row.Scan(&s.part, &s.seq, &s.ctid, &s.key, &s.wait)
			return s, err
		})
		return err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return held, win, err
}

// move moves the cursors of the partitions in the window past their last
// row, but not past the horizon, and makes the next scan start after the
// window's last partition, so that every partition gets its turn. It
// reports whether a cursor moved.
func (w *worker) move(win []scanned) bool {
	last := map[int32]int64{}
	for _, s := range win {
		last[s.part] = max(last[s.part], s.seq)
		w.seen = max(w.seen, s.seq)
	}
	moved := false
	for p, seq := range last {
		if c := min(seq+1, w.horizon+1); c > w.cursors[p] {
			w.cursors[p] = c
			moved = true
		}
	}
	if len(win) > 0 {
		w.next = win[len(win)-1].part + 1
	}
	if w.ownsAll() {
		// The scan read every partition up to its last row.
		c := w.cursors[-1]
		for _, seq := range last {
			c = max(c, min(seq+1, w.horizon+1))
		}
		for _, p := range w.partitions() {
			moved = moved || c > w.cursors[p]
			w.cursors[p] = max(w.cursors[p], c)
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

// pick walks the window in seq order and returns the rows to claim.
func (w *worker) pick(win []scanned) (picked []scanned) {
	for _, s := range win {
		switch {
		case s.key == nil:
			if s.wait != 0 {
				w.back.add(s.seq, s.wait)
				continue
			}
		case w.blocked[*s.key]:
			continue
		case s.wait != 0:
			w.blocked[*s.key] = true
			w.back.add(s.seq, s.wait)
			continue
		}
		picked = append(picked, s)
	}
	return picked
}

// claim deletes and returns the picked rows, in seq order. With
// ParkFollowers, the rows of keys that have a dead letter stay, and their
// keys are blocked: they are parked.
func (w *worker) claim(ctx context.Context, tx *claimTx, picked []scanned) ([]row, error) {
	r := w.r
	ctids := make([]pgtype.TID, len(picked))
	parts := make(map[int64]int32, len(picked)) // seq -> partition
	keyed := false
	for i, s := range picked {
		ctids[i] = s.ctid
		parts[s.seq] = s.part
		keyed = keyed || s.key != nil
	}
	park := r.cfg.ParkFollowers && keyed
	stmt := r.sql.Claim
	if park {
		stmt = r.sql.ClaimParked
	}
	rs, err := tx.conn.Query(ctx, stmt, ctids)
	if err != nil {
		return nil, err
	}
	rows, err := pgx.CollectRows(rs, func(cr pgx.CollectableRow) (row, error) {
		var c row
		var key *string
		if err := cr.Scan(&c.seq, &c.msg.ID, &c.msg.Destination, &key, &c.msg.Payload, &c.headers, &c.msg.Attempts, &c.msg.CreatedAt); err != nil {
			return c, err
		}
		if key != nil {
			c.msg.Key = *key
		}
		c.msg.Seq, c.msg.Partition, c.msg.LeaseToken = c.seq, int(parts[c.seq]), w.token(parts[c.seq])
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.seq, b.seq) })
	if park && len(rows) < len(picked) {
		got := make(map[int64]bool, len(rows))
		for _, c := range rows {
			got[c.seq] = true
		}
		for _, s := range picked {
			if !got[s.seq] && s.key != nil && !w.blocked[*s.key] {
				w.blocked[*s.key] = true
				w.back.add(s.seq, -1)
			}
		}
	}
	return rows, nil
}

// settled blocks the keys of the rows a committed batch put back or buried
// (behind a parked dead letter) and notes where the rows are.
func (w *worker) settled(d decision) {
	for i, seq := range d.back.seqs {
		if k := d.back.keys[i]; k != nil {
			w.blocked[*k] = true
		}
		w.back.add(seq, max(d.back.delays[i], -1))
	}
	for _, k := range d.parkKeys {
		w.blocked[k] = true
	}
}

// publish hands copies of the rows to the Sink and returns the failed
// indexes and the duration of the call. A row whose stored headers do not
// decode fails permanently on its own, and its key's followers with it.
func (r *Relay) publish(work context.Context, rows []row) (map[int]error, time.Duration) {
	msgs := make([]Message, len(rows))
	f := NewFailures(msgs)
	send := make([]int, 0, len(rows))
	for i, c := range rows {
		msgs[i] = c.msg
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
	ctx, cancel := context.WithTimeout(work, r.cfg.PublishTimeout)
	defer cancel()
	start := time.Now()
	f.Merge(send, publish(ctx, r.sink, batch))
	return f.failed, time.Since(start)
}

// settlePolicy is what decide needs from the configuration.
type settlePolicy struct {
	retry idemq.Retry
	park  bool
}

func (r *Relay) policy() settlePolicy {
	return settlePolicy{retry: r.cfg.Retry, park: r.cfg.ParkFollowers}
}

// decision is what becomes of a claimed batch.
type decision struct {
	back, dead rowSet   // put back, buried
	parkKeys   []string // keys whose followers wait behind a dead letter
	delivered  []Message
	failed     []FailedEvent
	retried    []RetriedEvent
	buried     []DeadLetteredEvent
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
	blocked := map[string]time.Duration{} // key -> delay of its failed head
	for i, c := range rows {
		m := c.msg
		err := failed[i]
		if err == nil {
			d.delivered = append(d.delivered, m)
			continue
		}
		d.failed = append(d.failed, FailedEvent{Message: m, Err: err})
		delay, isBlocked := blocked[m.Key]
		isBlocked = isBlocked && m.Key != ""
		permanent := idemq.IsPermanent(err)
		switch {
		case isBlocked && !permanent:
			// Held behind an earlier row of its key: not an attempt.
			d.back.add(c, m.Attempts, delay, err)
			continue
		case !isBlocked && errors.Is(err, ErrSkipped) && !permanent:
			// Skipped behind a row that became a dead letter: again now; or
			// held by the Sink (ErrSkipped with a RetryAfter hint): again
			// then, its key's followers behind it. Not an attempt.
			hold, _ := idemq.RetryAfterHint(err)
			d.back.add(c, m.Attempts, hold, err)
			if m.Key != "" && hold > 0 {
				blocked[m.Key] = hold
			}
			continue
		}
		attempts := m.Attempts + 1
		if permanent || attempts >= p.retry.MaxAttempts {
			d.dead.add(c, attempts, 0, err)
			m.Attempts = attempts
			d.buried = append(d.buried, DeadLetteredEvent{Message: m, Err: err})
			if p.park && m.Key != "" {
				blocked[m.Key] = parkDelay
				d.parkKeys = append(d.parkKeys, m.Key)
			}
			continue
		}
		hint, _ := idemq.RetryAfterHint(err)
		delay = p.retry.Delay(attempts, hint)
		d.back.add(c, attempts, delay, err)
		d.retried = append(d.retried, RetriedEvent{Message: m, Err: err, Delay: delay})
		if m.Key != "" {
			blocked[m.Key] = delay
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
		b.Queue(r.sql.Bury, s.seqs, s.ids, s.created, s.attempts, s.dests, s.payloads, s.keys, s.headers, s.errs)
	}
	if len(d.parkKeys) > 0 {
		b.Queue(r.sql.Park, d.parkKeys)
	}
	b.Queue("COMMIT")
	if err := tx.conn.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	tx.open = false
	return nil
}

// report calls the hooks and logs the dead letters of a committed batch.
func (r *Relay) report(d decision, took time.Duration) {
	if h := r.cfg.Hooks.OnPublished; h != nil && len(d.delivered) > 0 {
		h(PublishedEvent{Messages: d.delivered, Took: took})
	}
	if h := r.cfg.Hooks.OnRetried; h != nil {
		for _, e := range d.retried {
			h(e)
		}
	}
	for _, e := range d.buried {
		m := e.Message
		r.log.Warn("relay dead-lettered a message", "id", m.ID, "destination", m.Destination, "key", m.Key, "attempts", m.Attempts, "err", e.Err)
		if h := r.cfg.Hooks.OnDeadLettered; h != nil {
			h(e)
		}
	}
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
