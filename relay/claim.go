package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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
//  5. publish the claimed rows through the Sink, as copies, under the
//     batch's BatchID.
//  6. decide, without the database, what becomes of each row: delivered,
//     put back (same seq, so the same place in its key's order, and its
//     key blocked until it is due) or buried in the dead letters.
//  7. settle: apply the decision and commit in one round trip.
//  8. move the cursors past the window.
//
// The cursors and the horizon are the window's (window.go).
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
	win         *window
	seqs        sequenceWatch
	marked      map[int32]int64 // partition -> lease token whose Watermarker watermark was applied
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
	w.win.rewindDue(time.Now(), r.cfg.RescanInterval)
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
	picked := w.win.pick(win, time.Now())
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
		failed, took = r.publish(pctx, BatchID(batches.Add(1)), rows, behind)
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
	w.win.settled(d.back.seqs, d.back.delays, d.parkSeqs, picked, time.Now())
	r.claimedRows(len(rows))
	r.report(d, took)

	// 8. Move on.
	moved := w.win.move(win, w.ownsAll(), w.partitions())
	more := len(win) >= r.cfg.BatchSize && moved
	if len(w.leases) > w.target() && !w.stuck && time.Now().Before(w.rebalanceAt) {
		w.rebalanceAt = time.Time{} // give up the extra partitions now
	}
	return len(rows), more, nil
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
	horizon := w.win.needsHorizon() || w.seqs.due()
	if horizon {
		b.Queue(r.sql.Lock)
		b.Queue(r.sql.Top, r.seqOID, r.sql.Table)
		b.Queue(r.sql.Writers, r.sql.Table, w.win.pending)
	}
	parts := w.partitions()
	starts, cursors, blocked := w.win.from(parts)
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
			w.win.advance(top, writers, ended)
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

// ownsAll reports whether the worker owns every partition: its scans then
// read the whole outbox in seq order (ScanAll), with one cursor.
func (w *worker) ownsAll() bool { return len(w.leases) == outboxsql.Partitions }

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
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.seq, b.seq) })
	seqs := make([]int64, len(rows))
	for i := range rows {
		seqs[i] = rows[i].seq
	}
	of, behind := w.win.claimed(picked, seqs, r.cfg.PollInterval, time.Now())
	for i := range rows {
		c := &rows[i]
		c.msg.Seq, c.msg.Partition, c.msg.LeaseToken = c.seq, int(of[i]), w.token(of[i])
	}
	return rows, behind, nil
}

// batches numbers the relay batches of the process: a Sink shared by two
// relays tells their batches apart.
var batches atomic.Uint64

// publish hands copies of the rows to the Sink as batch id, in ctx (see
// fence), except
// those failed beforehand (behind, by index) and their key's followers,
// and returns the failed indexes and the duration of the call. A row whose
// stored headers do not decode fails permanently on its own, and its key's
// followers with it.
func (r *Relay) publish(ctx context.Context, id BatchID, rows []row, behind map[int]error) (map[int]error, time.Duration) {
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
	f.Merge(send, publish(ctx, r.sink, id, batch))
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
