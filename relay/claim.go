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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/outboxsql"
)

// How a batch is claimed (one transaction per batch; the statements are in
// internal/outboxsql):
//
//  1. scan: the first BatchSize due rows from the cursor on, in seq order,
//     FOR UPDATE SKIP LOCKED, taking the key lock of every keyed row and
//     leaving out rows whose key another relay holds. The Workers of one
//     relay split the keys by hash, so they never contend for a key among
//     themselves (they share unkeyed rows through SKIP LOCKED); separate
//     relays contend through the locks. Locking the rows here costs what
//     the bare DELETE ... SKIP LOCKED drain pays anyway, and lets unkeyed
//     rows go straight to the delete.
//  2. claim, in a new statement and therefore a snapshot taken after the
//     locks: for every locked key, its first n rows from the key's real
//     head (n is the key's count in the window), provided that head is the
//     key's first row in the window, plus the unkeyed rows of the scan; all
//     deleted with RETURNING. Only holders of a key's lock claim or move
//     that key's rows, so the rows of a key are never in two batches at
//     once, and the fresh snapshot sees whatever the previous holder
//     committed (a retried head put back with a later available_at).
//  3. publish the claimed rows through the Sink, as copies.
//  4. decide, without the database, what becomes of each row: delivered,
//     put back (same seq, so the same place in its key's order) or buried
//     in the dead letters.
//  5. commit: apply the decision and commit in one round trip.
//
// A relay that dies rolls back: its rows and locks return by themselves.

type worker struct {
	r        *Relay
	part     int // this worker's share of the keys: hash(key) mod Workers
	cursor   int64
	lastFull time.Time
}

// window is what a scan locked: the keys with their row counts and first
// seqs, and the unkeyed rows.
type window struct {
	keys    []string
	counts  []int32
	firsts  []int64
	unkeyed []int64
	min     int64 // lowest seq, -1 for an empty window
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
// rows claimed, or 1 when it found nothing from its cursor on and wants an
// immediate rescan from the start.
func (w *worker) batch(ctx, work context.Context) (int, error) {
	r := w.r
	if w.cursor > 0 && time.Since(w.lastFull) >= r.cfg.RescanInterval {
		w.cursor = 0
	}
	if w.cursor == 0 {
		w.lastFull = time.Now()
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	tx := &claimTx{conn: conn}
	defer tx.rollback(ctx)

	win, err := w.scan(ctx, tx)
	if err != nil {
		return 0, fmt.Errorf("relay: scan: %w", err)
	}
	if win.min < 0 {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return 0, err
		}
		tx.open = false
		if w.cursor > 0 {
			w.cursor = 0
			return 1, nil
		}
		return 0, nil
	}
	rows, err := w.claim(ctx, tx, win)
	if err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	failed, took := r.publish(work, rows)
	if work.Err() != nil {
		// Shutdown grace is over: release the rows for the next relay
		// without counting an attempt.
		return 0, nil
	}
	d := decide(rows, failed, win.keys, r.policy())
	for _, e := range d.failed {
		if h := r.cfg.Hooks.OnFailed; h != nil {
			h(e)
		}
	}
	if err := r.commit(work, tx, d); err != nil {
		return 0, fmt.Errorf("relay: settle and commit: %w", err)
	}
	r.claimedRows(len(rows))
	if len(rows) >= r.cfg.BatchSize {
		w.cursor = win.min
	} else {
		w.cursor = 0
	}
	r.report(d, took)
	return len(rows), nil
}

// scan begins the transaction and locks a window of due rows.
func (w *worker) scan(ctx context.Context, tx *claimTx) (window, error) {
	r := w.r
	win := window{min: -1}
	idle := strconv.FormatInt((r.cfg.PublishTimeout + 10*time.Second).Milliseconds(), 10)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// Generic plans: the statements are the same every time and custom
	// planning costs as much as executing them.
	b.Queue("SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true)", idle)
	b.Queue(r.sql.Scan, r.sql.LockClass, r.cfg.BatchSize, w.cursor, r.cfg.Workers, w.part)
	tx.open = true
	br := tx.conn.SendBatch(ctx, b)
	err := func() error {
		if _, err := br.Exec(); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		index := map[string]int{}
		for rows.Next() {
			var seq int64
			var key *string
			if err := rows.Scan(&seq, &key); err != nil {
				return err
			}
			if win.min < 0 || seq < win.min {
				win.min = seq
			}
			if key == nil {
				win.unkeyed = append(win.unkeyed, seq)
				continue
			}
			if i, ok := index[*key]; ok {
				win.counts[i]++
				win.firsts[i] = min(win.firsts[i], seq)
				continue
			}
			index[*key] = len(win.keys)
			win.keys = append(win.keys, *key)
			win.counts = append(win.counts, 1)
			win.firsts = append(win.firsts, seq)
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return win, err
}

// claim deletes and returns the rows the window entitles the batch to, in
// seq order.
func (w *worker) claim(ctx context.Context, tx *claimTx, win window) ([]row, error) {
	r := w.r
	stmt := r.sql.Claim
	if r.cfg.ParkFollowers {
		stmt = r.sql.ClaimParked
	}
	rs, err := tx.conn.Query(ctx, stmt, win.keys, win.counts, win.unkeyed, win.firsts)
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
		return c, nil
	})
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(a.seq, b.seq) })
	return rows, err
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
	idleKeys   []string // locked keys that yielded no row
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
// locked are the keys the scan locked: those that yielded no row are idle.
func decide(rows []row, failed map[int]error, locked []string, p settlePolicy) decision {
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
	got := make(map[string]bool, len(rows))
	for _, c := range rows {
		got[c.msg.Key] = true
	}
	for _, k := range locked {
		if !got[k] {
			d.idleKeys = append(d.idleKeys, k)
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
	if len(d.idleKeys) > 0 {
		b.Queue(r.sql.Bump, d.idleKeys, r.cfg.ParkFollowers)
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
