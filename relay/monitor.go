package relay

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/outboxsql"
	"github.com/idemq/idemq/outbox"
)

// The relay's log speaks once per change of state, never once per row: an
// operator reads it to learn what changed (a broker went away, a partition
// changed hands, the backlog stopped draining), and counts rows in the
// metrics. monitor keeps the states shared by a relay's workers and logs
// their transitions:
//
//   - a destination: ok, failing (every publish to it in a batch failed,
//     none permanently, and none was delivered: its broker or webhook
//     endpoint is away or refusing), or held (its messages come
//     back without an attempt: no route, an endpoint disabled or behind an
//     open breaker); a delivery makes it ok again;
//   - the database: reachable or not, as the workers' rounds find it;
//   - the partitions a worker owns: acquired (from whom, with which
//     token), released, lost to another worker;
//   - the backlog, read every StatsInterval: a line while messages are
//     pending, a stall when a message free to go has been due longer than
//     StallThreshold, and a line when either ends.

// Hold reasons of [HeldEvent].
const (
	// HoldNoRoute: no route of the Router matches the destination.
	HoldNoRoute = "no_route"
	// HoldSink: the Sink held the message (ErrSkipped with a RetryAfter
	// hint), such as a disabled webhook endpoint or an open breaker.
	HoldSink = "sink"
)

// HoldReason names why err held a message: [HoldNoRoute] or [HoldSink].
func HoldReason(err error) string {
	if errors.Is(err, ErrNoRoute) {
		return HoldNoRoute
	}
	return HoldSink
}

type monitor struct {
	log   *slog.Logger
	stall time.Duration
	pool  *pgxpool.Pool
	sql   outboxsql.Queries

	mu    sync.Mutex
	dests map[string]*destState // destinations that are not ok
	db    outage                // the database, as the workers find it
	wm    outage                // the Sink's watermarks (Watermarker), as the workers find them
	// the backlog as last read
	pending, stalled bool
}

// outage is a stretch of failures.
type outage struct {
	since    time.Time // zero: none
	failures int
}

// destState is a destination that is failing or held.
type destState struct {
	held   string // hold reason, "" while failing
	outage outage
}

func newMonitor(r *Relay) *monitor {
	return &monitor{log: r.log, stall: r.cfg.StallThreshold, pool: r.pool, sql: r.sql, dests: map[string]*destState{}}
}

// settled updates the destinations from a committed batch's outcome.
func (m *monitor) settled(d decision) {
	type tally struct {
		delivered, failed int
		err               error // the first failure
		held              *HeldEvent
	}
	var order []string
	by := map[string]*tally{}
	get := func(dest string) *tally {
		t := by[dest]
		if t == nil {
			t = &tally{}
			by[dest] = t
			order = append(order, dest)
		}
		return t
	}
	for _, msg := range d.delivered {
		get(msg.Destination).delivered++
	}
	for _, e := range d.failed {
		if idemq.IsPermanent(e.Err) {
			continue // the message is refused, not the broker away
		}
		t := get(e.Message.Destination)
		t.failed++
		if t.err == nil {
			t.err = e.Err
		}
	}
	for i := range d.held {
		if t := get(d.held[i].Message.Destination); t.held == nil {
			t.held = &d.held[i]
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	for _, dest := range order {
		t, st := by[dest], m.dests[dest]
		switch {
		case t.delivered > 0:
			if st == nil {
				continue
			}
			delete(m.dests, dest)
			if st.held != "" {
				m.log.Log(context.Background(), holdLevel(st.held), "relay: destination no longer held", "destination", dest, "reason", st.held, "held_for", now.Sub(st.outage.since))
			} else {
				m.log.Info("relay: destination failing no more: it takes messages again", "destination", dest, "lasted", now.Sub(st.outage.since), "failed_publishes", st.outage.failures)
			}
		case t.failed > 0:
			if st != nil && st.held == "" {
				st.outage.failures += t.failed
				continue
			}
			m.dests[dest] = &destState{outage: outage{since: now, failures: t.failed}}
			m.log.Warn("relay: destination failing: publishing to it fails (its broker or webhook endpoint is away or refusing); its messages are retried with backoff", "destination", dest, "err", t.err)
		case t.held != nil:
			reason := HoldReason(t.held.Err)
			if st != nil && st.held == reason {
				continue
			}
			m.dests[dest] = &destState{held: reason, outage: outage{since: now}}
			m.log.Log(context.Background(), holdLevel(reason), "relay: holding the messages of a destination; they stay in the outbox and come back without an attempt",
				"destination", dest, "reason", reason, "retry_in", t.held.Delay, "err", t.held.Err)
		}
	}
}

// holdLevel is the level of a destination's hold lines: a missing route is
// the relay's to report; a Sink's holds (a rate limit, a breaker, a
// disabled endpoint) come and go in normal operation and the Sink logs
// their causes itself, so the relay reports them at debug level.
func holdLevel(reason string) slog.Level {
	if reason == HoldNoRoute {
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

// roundFailed notes a failed round of a worker; retry is its wait. A
// round fails on the database, or on the Sink's watermark (errWatermark),
// which are different outages for the operator.
func (m *monitor) roundFailed(err error, retry time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, began := &m.db, "relay: database unavailable; retrying"
	if errors.Is(err, errWatermark) {
		o, began = &m.wm, "relay: the Sink cannot give a partition's watermark; the partition's rows wait for it; retrying"
	}
	o.failures++
	if !o.since.IsZero() {
		m.log.Debug("relay: round failed again", "err", err, "retry_in", retry)
		return
	}
	o.since = time.Now()
	m.log.Warn(began, "err", err, "retry_in", retry)
}

// roundOK notes a round that went through.
func (m *monitor) roundOK() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.db.since.IsZero() {
		m.log.Info("relay: database available again", "lasted", time.Since(m.db.since), "failed_rounds", m.db.failures)
		m.db = outage{}
	}
	if !m.wm.since.IsZero() {
		m.log.Info("relay: the Sink's watermarks readable again", "lasted", time.Since(m.wm.since), "failed_rounds", m.wm.failures)
		m.wm = outage{}
	}
}

// acquired logs the partitions worker took; from holds each one's
// previous owner (nil: nobody). A line names the partitions and their
// tokens as spans ("0-63"), and for a takeover the spans each previous
// owner had, so that a relay taking all 64 logs a short line.
func (m *monitor) acquired(worker uuid.UUID, taken []lease, from []*uuid.UUID) {
	if len(taken) == 0 {
		return
	}
	parts, tokens := partsOf(taken)
	byOwner := map[uuid.UUID][]int64{}
	var owners []uuid.UUID
	for i, f := range from {
		if f != nil && i < len(taken) {
			if byOwner[*f] == nil {
				owners = append(owners, *f)
			}
			byOwner[*f] = append(byOwner[*f], int64(taken[i].part))
		}
	}
	if len(owners) > 0 {
		over := make([]string, len(owners))
		for i, o := range owners {
			over[i] = o.String() + ":" + spans(byOwner[o])
		}
		m.log.Warn("relay: partitions taken over from workers that stopped heartbeating", "worker", worker, "partitions", parts, "tokens", tokens, "from", strings.Join(over, " "))
		return
	}
	m.log.Info("relay: partitions acquired", "worker", worker, "partitions", parts, "tokens", tokens)
}

// released logs partitions a worker gave up to let others have their share.
func (m *monitor) released(worker uuid.UUID, parts []int32) {
	if len(parts) > 0 {
		ps := make([]int64, len(parts))
		for i, p := range parts {
			ps[i] = int64(p)
		}
		m.log.Info("relay: partitions released for rebalancing", "worker", worker, "partitions", spans(ps))
	}
}

// lost logs partitions a worker found it no longer owns, with who owns
// them now (per owner, "nobody" included, its partitions as spans) and
// their tokens.
func (m *monitor) lost(worker uuid.UUID, before, after []lease) {
	var gone []int64
	for _, l := range before {
		if !containsPart(after, l.part) {
			gone = append(gone, int64(l.part))
		}
	}
	if len(gone) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	byOwner := map[string][]int64{}
	var owners []string
	var tokens []int64
	rows, err := m.pool.Query(ctx, m.sql.Owners, gone)
	if err == nil {
		for rows.Next() {
			var part int32
			var owner *uuid.UUID
			var token int64
			if err = rows.Scan(&part, &owner, &token); err != nil {
				break
			}
			who := "nobody"
			if owner != nil {
				who = owner.String()
			}
			if byOwner[who] == nil {
				owners = append(owners, who)
			}
			byOwner[who] = append(byOwner[who], int64(part))
			tokens = append(tokens, token)
		}
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		m.log.Warn("relay: partitions lost to another worker", "worker", worker, "partitions", spans(gone), "owners_err", err)
		return
	}
	now := make([]string, len(owners))
	for i, o := range owners {
		now[i] = o + ":" + spans(byOwner[o])
	}
	m.log.Warn("relay: partitions lost to another worker", "worker", worker, "partitions", spans(gone), "now", strings.Join(now, " "), "tokens", spans(tokens))
}

// partsOf returns the partitions of ls and their tokens as spans.
func partsOf(ls []lease) (parts, tokens string) {
	ps, ts := make([]int64, len(ls)), make([]int64, len(ls))
	for i, l := range ls {
		ps[i], ts[i] = int64(l.part), l.token
	}
	return spans(ps), spans(ts)
}

// spans writes a set of numbers as sorted runs, "0-31,33,40-63".
func spans(v []int64) string {
	v = slices.Compact(slices.Sorted(slices.Values(v)))
	var b strings.Builder
	for i := 0; i < len(v); {
		j := i
		for j+1 < len(v) && v[j+1] == v[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(v[i], 10))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.FormatInt(v[j], 10))
		}
		i = j + 1
	}
	return b.String()
}

func containsPart(ls []lease, part int32) bool {
	for _, l := range ls {
		if l.part == part {
			return true
		}
	}
	return false
}

// backlog logs the backlog read every StatsInterval: a line while
// messages are pending, one when it drained, and the start and end of a
// stall.
func (m *monitor) backlog(s outbox.Stats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Pending > 0 {
		m.log.Info("relay: backlog", "pending", s.Pending, "oldest", s.OldestPending, "waiting", s.Waiting,
			"parked", s.Parked, "unrouted", s.Unrouted, "oldest_due", s.OldestDue, "dead", s.Dead)
	} else if m.pending {
		m.log.Info("relay: backlog drained", "dead", s.Dead)
	}
	m.pending = s.Pending > 0
	switch stalled := s.OldestDue > m.stall; {
	case stalled && !m.stalled:
		m.log.Warn("relay: stalled: a message free to go has been due longer than StallThreshold",
			"oldest_due", s.OldestDue, "threshold", m.stall, "pending", s.Pending)
	case !stalled && m.stalled:
		m.log.Info("relay: stall over", "oldest_due", s.OldestDue)
	}
	m.stalled = s.OldestDue > m.stall
}

// report calls the hooks of a committed batch and tells the monitor; dead
// letters get one line per batch.
func (r *Relay) report(d decision, took time.Duration) {
	h := r.cfg.Hooks
	if h.OnPublished != nil && len(d.delivered) > 0 {
		h.OnPublished(PublishedEvent{Messages: d.delivered, Took: took})
	}
	for _, e := range d.retried {
		if h.OnRetried != nil {
			h.OnRetried(e)
		}
	}
	for _, e := range d.held {
		if h.OnHeld != nil {
			h.OnHeld(e)
		}
	}
	for _, e := range d.skipped {
		if h.OnSkipped != nil {
			h.OnSkipped(e)
		}
	}
	for _, e := range d.buried {
		if h.OnDeadLettered != nil {
			h.OnDeadLettered(e)
		}
	}
	if len(d.buried) > 0 {
		first := d.buried[0].Message
		r.log.Warn("relay: dead-lettered messages", "count", len(d.buried), "first_id", first.ID, "destination", first.Destination,
			"key", first.Key, "attempts", first.Attempts, "err", d.buried[0].Err)
	}
	r.mon.settled(d)
}
