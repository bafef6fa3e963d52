package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
)

// How a batch is claimed (one transaction per batch):
//
//  1. scan: the first BatchSize due rows from the cursor on, in seq order,
//     FOR UPDATE SKIP LOCKED, taking a transaction-scoped advisory lock on
//     the key of every keyed row and leaving out rows whose key another
//     relay holds. The Workers of one relay split the keys by hash, so
//     they never contend for a key among themselves (they share unkeyed
//     rows through SKIP LOCKED); separate relays contend through the locks. Locking the rows here costs what the bare
//     DELETE ... SKIP LOCKED drain pays anyway, and lets unkeyed rows go
//     straight to the delete.
//  2. claim, in a new statement and therefore a snapshot taken after the
//     locks: for every locked key, its first n rows from the key's real
//     head (n is the key's count in the window), provided that head is the
//     key's first row in the window (which the scan found due and locked;
//     a head that lies before the cursor, is not due, or was put back by a
//     previous holder after the scan's snapshot has a lower seq), plus the
//     unkeyed rows of the scan; all deleted with RETURNING.
//     Only holders of a key's lock claim or move that key's rows, so the
//     rows of a key are never in two batches at once, and the fresh
//     snapshot sees whatever the previous holder committed (a retried head
//     put back with a later available_at, for example).
//  3. publish, then in one round trip: put failed rows back (same seq, so
//     the same place in their key's order) or move them to the dead
//     letters, and commit.
//
// A relay that dies rolls back: its rows and locks return by themselves.
type statements struct {
	scan, claim, putBack, bury, park, bump string
}

func newStatements(ob *outbox.Outbox, park bool) statements {
	t, dead := ob.Table(), ob.DeadTable()
	parked := ""
	if park {
		parked = "AND NOT EXISTS (SELECT 1 FROM " + dead + " AS d WHERE d.key = k.key)"
	}
	return statements{
		scan: `SELECT seq, key FROM ` + t + `
WHERE seq >= $3 AND CASE WHEN available_at > now() THEN false
                         WHEN key IS NULL THEN true
                         WHEN $4 > 1 AND mod(hashtext(key)::int8 + 2147483648, $4) <> $5 THEN false
                         ELSE pg_try_advisory_xact_lock($1, hashtext(key)) END
ORDER BY seq LIMIT $2
FOR UPDATE SKIP LOCKED`,
		// One index probe per key finds its real head; the key qualifies if
		// that head is the row the scan locked first for it, which was due
		// (a head before the cursor, not due, or put back by a previous
		// holder after the scan's snapshot has a lower seq). Keys with more
		// rows in the window then take the rows that follow.
		claim: `WITH k AS (
  SELECT key, n, first FROM unnest($1::text[], $2::int4[], $4::int8[]) AS k(key, n, first)
), heads AS (
  SELECT k.key, k.n, k.first FROM k
  WHERE (SELECT o.seq FROM ` + t + ` AS o WHERE o.key = k.key ORDER BY o.seq LIMIT 1) = k.first ` + parked + `
), keyed AS (
  SELECT first AS seq FROM heads
  UNION ALL
  SELECT r.seq FROM heads CROSS JOIN LATERAL (
    SELECT o.seq FROM ` + t + ` AS o WHERE o.key = heads.key AND o.seq > heads.first ORDER BY o.seq LIMIT heads.n - 1) AS r
)
DELETE FROM ` + t + ` WHERE seq = ANY(ARRAY(SELECT seq FROM keyed UNION ALL SELECT unnest($3::int8[])))
RETURNING seq, id, destination, key, payload, headers, attempts, created_at`,
		putBack: `INSERT INTO ` + t + ` (seq, id, created_at, available_at, attempts, destination, payload, key, headers, last_error)
SELECT s, i, c, CASE WHEN d < 0 THEN 'infinity'::timestamptz ELSE clock_timestamp() + d * interval '1 microsecond' END,
       a, dst, p, k, h::jsonb, e
FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int8[], $5::int4[], $6::text[], $7::bytea[], $8::text[], $9::text[], $10::text[])
     AS u(s, i, c, d, a, dst, p, k, h, e)`,
		bury: `INSERT INTO ` + dead + ` (seq, id, created_at, failed_at, attempts, destination, payload, key, headers, last_error)
SELECT s, i, c, clock_timestamp(), a, dst, p, k, h::jsonb, e
FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int4[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::text[])
     AS u(s, i, c, a, dst, p, k, h, e)`,
		park: `UPDATE ` + t + ` SET available_at = 'infinity' WHERE key = ANY($1) AND available_at <> 'infinity'`,
		// A locked key that yielded nothing has a head that is not due (or
		// is parked): move its followers behind the head so that scans stop
		// spending their window on them.
		bump: `WITH h AS (
  SELECT k.key, CASE WHEN $2 AND EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.key = k.key) THEN 'infinity'::timestamptz
                     ELSE (SELECT x.available_at FROM ` + t + ` AS x WHERE x.key = k.key ORDER BY x.seq LIMIT 1) END AS until
  FROM unnest($1::text[]) AS k(key))
UPDATE ` + t + ` AS o SET available_at = h.until FROM h WHERE o.key = h.key AND o.available_at < h.until`,
	}
}

type worker struct {
	r        *Relay
	part     int // this worker's share of the keys: hash(key) mod Workers
	cursor   int64
	lastFull time.Time
}

// claimedRow is a claimed message with what putting it back needs.
type claimedRow struct {
	seq int64
	msg Message
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

func (s *rowSet) add(c claimedRow, attempts int, delay time.Duration, cause error) {
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
	if m.Headers != nil {
		if js, err := json.Marshal(m.Headers); err == nil {
			h := string(js)
			headers = &h
		}
	}
	s.keys = append(s.keys, key)
	s.headers = append(s.headers, headers)
	s.errs = append(s.errs, errorText(cause))
}

// errorText makes an error storable in a text column.
func errorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "?")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > 4096 {
		s = strings.ToValidUTF8(s[:4096], "")
	}
	return s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// parkDelay marks rows put back with available_at = infinity.
const parkDelay = -1

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
	inTx := false
	defer func() {
		if inTx {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()

	// 1. BEGIN and scan in one round trip.
	idle := strconv.FormatInt((r.cfg.PublishTimeout + 10*time.Second).Milliseconds(), 10)
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	// Generic plans: the statements are the same every time and custom
	// planning costs as much as executing them.
	b.Queue("SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('plan_cache_mode', 'force_generic_plan', true)", idle)
	b.Queue(r.sql.scan, r.ob.LockClass(), r.cfg.BatchSize, w.cursor, r.cfg.Workers, w.part)
	inTx = true
	br := conn.SendBatch(ctx, b)
	var keys []string
	var counts []int32
	var firsts []int64
	var unkeyed []int64
	windowMin := int64(-1)
	err = func() error {
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
			if windowMin < 0 || seq < windowMin {
				windowMin = seq
			}
			switch i, ok := index[deref(key)]; {
			case key == nil:
				unkeyed = append(unkeyed, seq)
			case ok:
				counts[i]++
				firsts[i] = min(firsts[i], seq)
			default:
				index[*key] = len(keys)
				keys = append(keys, *key)
				counts = append(counts, 1)
				firsts = append(firsts, seq)
			}
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("relay: scan: %w", err)
	}
	if windowMin < 0 {
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return 0, err
		}
		inTx = false
		if w.cursor > 0 {
			w.cursor = 0
			return 1, nil
		}
		return 0, nil
	}

	// 2. Claim under a snapshot taken after the key locks: the prefix of
	// every locked key from its real head, and the unkeyed rows the scan
	// locked.
	rows, err := conn.Query(ctx, r.sql.claim, keys, counts, unkeyed, firsts)
	if err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimedRow, error) {
		var c claimedRow
		var key *string
		err := row.Scan(&c.seq, &c.msg.ID, &c.msg.Destination, &key, &c.msg.Payload, &c.msg.Headers, &c.msg.Attempts, &c.msg.CreatedAt)
		if key != nil {
			c.msg.Key = *key
		}
		return c, err
	})
	if err != nil {
		return 0, fmt.Errorf("relay: claim: %w", err)
	}
	slices.SortFunc(claimed, func(a, b claimedRow) int { return cmp.Compare(a.seq, b.seq) })

	// 3. Publish.
	msgs := make([]Message, len(claimed))
	for i := range claimed {
		msgs[i] = claimed[i].msg
	}
	var failed map[int]error
	var took time.Duration
	if len(msgs) > 0 {
		pctx, cancel := context.WithTimeout(work, r.cfg.PublishTimeout)
		start := time.Now()
		perr := r.sink.Publish(pctx, msgs)
		took = time.Since(start)
		cancel()
		if work.Err() != nil {
			// Shutdown grace is over: release the rows for the next relay
			// without counting an attempt.
			return 0, nil
		}
		if perr != nil {
			var pe *PublishError
			if errors.As(perr, &pe) {
				failed = pe.Failed
			} else {
				failed = make(map[int]error, len(msgs))
				for i := range msgs {
					failed[i] = perr
				}
			}
		}
	}

	// 4. Settle: failed rows back or to the dead letters, then commit.
	var back, dead rowSet
	var parkKeys []string
	type block struct {
		delay time.Duration // parkDelay: parked behind a dead letter
	}
	blocked := map[string]block{}
	delivered := msgs[:0:0]
	var retried, buried []func()
	for i, c := range claimed {
		m := c.msg
		err := failed[i]
		if err == nil {
			delivered = append(delivered, m)
			continue
		}
		if h := r.cfg.Hooks.Failed; h != nil {
			h(m, err)
		}
		blk, isBlocked := blocked[m.Key]
		isBlocked = isBlocked && m.Key != ""
		permanent := idemq.IsPermanent(err)
		switch {
		case isBlocked && !permanent:
			// Held behind an earlier row of its key: not an attempt.
			back.add(c, m.Attempts, blk.delay, err)
			continue
		case !isBlocked && errors.Is(err, ErrSkipped) && !permanent:
			// Skipped behind a row that became a dead letter: try again now.
			back.add(c, m.Attempts, 0, err)
			continue
		}
		attempts := m.Attempts + 1
		if permanent || attempts >= r.cfg.MaxAttempts {
			dead.add(c, attempts, 0, err)
			if h := r.cfg.Hooks.DeadLettered; h != nil {
				buried = append(buried, func() { h(m, err) })
			}
			r.log.Warn("relay dead-lettered a message", "id", m.ID, "destination", m.Destination, "key", m.Key, "attempts", attempts, "err", err)
			if r.cfg.ParkFollowers && m.Key != "" {
				blocked[m.Key] = block{delay: parkDelay}
				parkKeys = append(parkKeys, m.Key)
			}
			continue
		}
		delay := r.policy.Delay(attempts)
		if hint, ok := idemq.RetryAfterHint(err); ok && hint > delay {
			delay = hint
		}
		back.add(c, attempts, delay, err)
		if h := r.cfg.Hooks.Retried; h != nil {
			retried = append(retried, func() { h(m, err, delay) })
		}
		if m.Key != "" {
			blocked[m.Key] = block{delay: delay}
		}
	}
	var idleKeys []string
	if len(claimed) < r.cfg.BatchSize || len(keys) > 0 {
		got := make(map[string]bool, len(claimed))
		for _, c := range claimed {
			got[c.msg.Key] = true
		}
		for _, k := range keys {
			if !got[k] {
				idleKeys = append(idleKeys, k)
			}
		}
	}
	b = &pgx.Batch{}
	if len(back.seqs) > 0 {
		b.Queue(r.sql.putBack, back.seqs, back.ids, back.created, back.delays, back.attempts, back.dests, back.payloads, back.keys, back.headers, back.errs)
	}
	if len(dead.seqs) > 0 {
		b.Queue(r.sql.bury, dead.seqs, dead.ids, dead.created, dead.attempts, dead.dests, dead.payloads, dead.keys, dead.headers, dead.errs)
	}
	if len(parkKeys) > 0 {
		b.Queue(r.sql.park, parkKeys)
	}
	if len(idleKeys) > 0 {
		b.Queue(r.sql.bump, idleKeys, r.cfg.ParkFollowers)
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(work, b).Close(); err != nil {
		return 0, fmt.Errorf("relay: settle and commit: %w", err)
	}
	inTx = false
	r.claimedRows(len(claimed))

	if len(claimed) >= r.cfg.BatchSize {
		w.cursor = windowMin
	} else {
		w.cursor = 0
	}
	if h := r.cfg.Hooks.Published; h != nil && len(delivered) > 0 {
		h(delivered, took)
	}
	for _, f := range retried {
		f()
	}
	for _, f := range buried {
		f()
	}
	return len(claimed), nil
}
