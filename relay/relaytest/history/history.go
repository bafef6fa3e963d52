// Package history checks a recorded history of a relay's publishes
// against the relay's promises, the way Jepsen's checkers judge a history:
// a test records what happened (every row enqueued, every message a Sink
// published or rejected, every dead letter an operator purged), and
// [Check] says, without a database, whether the relay kept its word:
//
//   - [Reordered]: the rows of a key are first published in the order
//     they were enqueued: a row before the rows of its key enqueued after
//     its transaction committed, and before the later rows of its own
//     transaction (see [Row]). A row may be overtaken once it stopped
//     holding its key: after it was published, purged, or (without
//     Rules.ParkFollowers) rejected by the Sink, which makes it a dead
//     letter its followers pass.
//   - [StaleOwner]: a partition's owner never publishes after a successor
//     (a larger lease token on that partition) first published.
//   - [Lost]: every row enqueued and not purged is published by the end
//     of the history.
//   - [Late]: once the faults stopped (Rules.QuietFrom), every row is first
//     published within Rules.Bound.
//   - [Phantom] and [Altered]: nothing is published that was not enqueued,
//     and a published message carries the key, seq and destination it was
//     enqueued with.
//
// Duplicates are allowed (delivery is at least once) and counted.
//
// Recording a history that means something: record a row in the
// transaction that enqueues it (so that exactly the committed rows are
// recorded), with the time it was written and, once committed, the
// commit's; and a publish when the broker has it, with one clock for all
// relays (the recording database's clock_timestamp(), for instance), from
// the Sink's relay.Message fields Seq, Partition and LeaseToken. A
// replayed dead letter is not seen holding its key again.
package history

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Row is a row enqueued in the outbox.
type Row struct {
	ID          uuid.UUID
	Key         string
	Destination string
	Seq         int64
	// Tx identifies the transaction that enqueued the row (its xid): the
	// rows of one transaction are ordered by Seq.
	Tx int64
	// Written is when the row's transaction wrote it, no later than its
	// seq was drawn; Committed is when that transaction committed (with
	// Postgres's track_commit_timestamp on: pg_xact_commit_timestamp of
	// the recording row's xmin). A row precedes the rows of its key
	// written after it committed, and those of its own transaction with a
	// larger Seq; rows of concurrent transactions may go either way. When
	// a row of the history has no Written or Committed, Seq alone orders
	// every key, as if each transaction ended before the next one began.
	// Late measures its bound from Committed when that is after
	// Rules.QuietFrom.
	Written, Committed time.Time
}

// Publish is one Sink call's outcome for one message: published, or
// rejected (failed permanently).
type Publish struct {
	ID          uuid.UUID
	Key         string
	Destination string
	Seq         int64
	// Relay names the relay (process, worker) that published.
	Relay string
	// Partition and LeaseToken are the message's relay.Message fields:
	// the owner of a keyed message's partition, and the fence it held.
	Partition  int
	LeaseToken int64
	// At is when it happened, on one clock for every relay. Publishes with
	// the same At happened in their order in History.Published.
	At time.Time
}

// Purge is a dead letter an operator purged: the row is owed no publish.
type Purge struct {
	ID uuid.UUID
	// At is when the purge was decided (at or before its commit): its
	// key's followers may pass it from then on.
	At time.Time
}

// History is what a test recorded, in any order except as noted.
type History struct {
	// Enqueued are the rows whose enqueue committed.
	Enqueued []Row
	// Published are the messages Sinks published, duplicates included, in
	// the order they happened where their At ties.
	Published []Publish
	// Rejected are the messages Sinks failed permanently: the relay made
	// them dead letters.
	Rejected []Publish
	// Purged are the dead letters an operator purged.
	Purged []Purge
}

// Rules are the promises the history is checked against.
type Rules struct {
	// ParkFollowers is the relay's option of the same name: a key's later
	// rows wait behind its dead letter until it is replayed or purged, so
	// a rejection does not let them pass.
	ParkFollowers bool
	// QuietFrom is when the faults stopped. With a positive Bound, every
	// row owed a publish is first published by Bound after QuietFrom (or
	// after its Row.At, whichever is later).
	QuietFrom time.Time
	// Bound is the liveness bound; zero checks no bound, only loss.
	Bound time.Duration
}

// Kind is a kind of [Violation].
type Kind string

// The kinds of violations, in the order the package documentation lists
// them.
const (
	Reordered  Kind = "reordered"
	StaleOwner Kind = "stale owner"
	Lost       Kind = "lost"
	Late       Kind = "late"
	Phantom    Kind = "phantom"
	Altered    Kind = "altered"
)

// Violation is one broken promise.
type Violation struct {
	Kind Kind
	// Key is the ordering key of the offending row.
	Key string
	// Seqs are the outbox seqs of the rows concerned: the offending row
	// first, then (Reordered) the row it overtook or (StaleOwner) the row
	// the successor first published.
	Seqs []int64
	// At is when the offending publish happened; zero for Lost.
	At time.Time
	// Detail says what happened, with ids, relays, partitions and tokens.
	Detail string
}

func (v Violation) String() string { return string(v.Kind) + ": " + v.Detail }

// Report is the outcome of [Check].
type Report struct {
	// Enqueued, Published (distinct rows), Publishes (with duplicates),
	// Duplicates, Rejected and Purged count the history.
	Enqueued, Published, Publishes, Duplicates, Rejected, Purged int
	// Violations are in the order they happened; Lost ones, which have no
	// moment, come last.
	Violations []Violation
}

// Err is nil when the history kept every promise, and otherwise names the
// first violation and how many there are.
func (r Report) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	return fmt.Errorf("history: %d violations (%s); the first: %s", len(r.Violations), r.kinds(), r.Violations[0])
}

// kinds counts the violations by kind.
func (r Report) kinds() string {
	var parts []string
	for _, k := range []Kind{Reordered, StaleOwner, Lost, Late, Phantom, Altered} {
		n := 0
		for _, v := range r.Violations {
			if v.Kind == k {
				n++
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

// reportShown is how many violations String lists.
const reportShown = 20

// String summarises the history and lists the first violations.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "history: %d rows enqueued, %d published (%d publishes, %d duplicates), %d rejections, %d purged; ",
		r.Enqueued, r.Published, r.Publishes, r.Duplicates, r.Rejected, r.Purged)
	if len(r.Violations) == 0 {
		b.WriteString("no violations")
		return b.String()
	}
	fmt.Fprintf(&b, "%d violations (%s)", len(r.Violations), r.kinds())
	for i, v := range r.Violations {
		if i == reportShown {
			fmt.Fprintf(&b, "\n  ... %d more", len(r.Violations)-reportShown)
			break
		}
		fmt.Fprintf(&b, "\n  %s", v)
	}
	return b.String()
}

// ErrEmpty is returned by [Check] for a history without rows: a test whose
// recorder recorded nothing proves nothing.
var ErrEmpty = errors.New("history: nothing was enqueued; check the recorder")

// Check checks h against rules.
func Check(h History, rules Rules) (Report, error) {
	if len(h.Enqueued) == 0 {
		return Report{}, ErrEmpty
	}
	c := newChecker(h, rules)
	c.checkContent()
	c.checkOrder()
	c.checkFences()
	c.checkDelivery()
	slices.SortStableFunc(c.out, func(a, b Violation) int {
		switch {
		case a.At.IsZero() != b.At.IsZero():
			if a.At.IsZero() {
				return 1
			}
			return -1
		}
		return a.At.Compare(b.At)
	})
	r := Report{Enqueued: len(c.rows), Publishes: len(h.Published), Rejected: len(h.Rejected),
		Purged: len(c.purged), Violations: c.out}
	for _, n := range c.copies {
		r.Published++
		r.Duplicates += n - 1
	}
	return r, nil
}

// moment orders events: by At, then by n, the position of a publish in
// History.Published. Rejections and purges have n = -1: where their At
// ties with a publish's, they count as earlier, which never invents a
// violation.
type moment struct {
	at time.Time
	n  int
}

func (m moment) before(o moment) bool {
	if c := m.at.Compare(o.at); c != 0 {
		return c < 0
	}
	return m.n < o.n
}

// never is the moment of what did not happen.
var never = moment{at: time.Unix(1<<62, 0)}

type checker struct {
	h      History
	rules  Rules
	rows   map[uuid.UUID]Row
	first  map[uuid.UUID]int       // index in h.Published of a row's first publish
	copies map[uuid.UUID]int       // publishes per row
	freed  map[uuid.UUID]moment    // when a row stopped holding its key, short of its publish
	purged map[uuid.UUID]time.Time // purge moments
	out    []Violation
}

func newChecker(h History, rules Rules) *checker {
	c := &checker{h: h, rules: rules, rows: map[uuid.UUID]Row{}, first: map[uuid.UUID]int{},
		copies: map[uuid.UUID]int{}, freed: map[uuid.UUID]moment{}, purged: map[uuid.UUID]time.Time{}}
	for _, r := range h.Enqueued {
		c.rows[r.ID] = r
	}
	for i, p := range h.Published {
		c.copies[p.ID]++
		if j, ok := c.first[p.ID]; !ok || c.at(i).before(c.at(j)) {
			c.first[p.ID] = i
		}
	}
	free := func(id uuid.UUID, at time.Time) {
		if m, ok := c.freed[id]; !ok || at.Before(m.at) {
			c.freed[id] = moment{at: at, n: -1}
		}
	}
	for _, p := range h.Purged {
		c.purged[p.ID] = p.At
		free(p.ID, p.At)
	}
	if !rules.ParkFollowers {
		for _, p := range h.Rejected {
			free(p.ID, p.At)
		}
	}
	return c
}

// at is the moment of publish i.
func (c *checker) at(i int) moment { return moment{at: c.h.Published[i].At, n: i} }

func (c *checker) add(v Violation) { c.out = append(c.out, v) }

// checkContent finds publishes and rejections of rows never enqueued, and
// publishes that carry another key, seq or destination than their row.
func (c *checker) checkContent() {
	for _, set := range []struct {
		verb string
		ps   []Publish
	}{{"published", c.h.Published}, {"rejected", c.h.Rejected}} {
		verb := set.verb
		for _, p := range set.ps {
			r, ok := c.rows[p.ID]
			switch {
			case !ok:
				c.add(Violation{Kind: Phantom, Key: p.Key, Seqs: []int64{p.Seq}, At: p.At,
					Detail: fmt.Sprintf("%s, which was never enqueued (rolled back?)", describe(p, verb))})
			case r.Key != p.Key || r.Seq != p.Seq || r.Destination != p.Destination:
				c.add(Violation{Kind: Altered, Key: r.Key, Seqs: []int64{r.Seq}, At: p.At,
					Detail: fmt.Sprintf("%s, enqueued as key %q seq %d to %q", describe(p, verb), r.Key, r.Seq, r.Destination)})
			}
		}
	}
}

// checkOrder finds, per key, rows first published while a row that
// precedes them still held the key. A row holds its key until it is first
// published or freed (purged; rejected without ParkFollowers).
func (c *checker) checkOrder() {
	timed := true
	byKey := map[string][]Row{}
	for _, r := range c.rows {
		timed = timed && !r.Written.IsZero() && !r.Committed.IsZero()
		if r.Key != "" {
			byKey[r.Key] = append(byKey[r.Key], r)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		rows := byKey[k]
		for _, r := range rows {
			i, published := c.first[r.ID]
			if !published {
				continue
			}
			holder, held := c.holder(rows, r, timed)
			if !c.at(i).before(held) {
				continue
			}
			p := c.h.Published[i]
			c.add(Violation{Kind: Reordered, Key: k, Seqs: []int64{r.Seq, holder.Seq}, At: p.At,
				Detail: fmt.Sprintf("key %q: seq %d (id %s) first published at %s by %s (partition %d, token %d) while seq %d (id %s), %s, still held the key: %s",
					k, r.Seq, r.ID, stamp(p.At), p.Relay, p.Partition, p.LeaseToken, holder.Seq, holder.ID, why(holder, r, timed), c.fate(holder))})
		}
	}
}

// holder returns, of the rows of r's key that precede r, the one that held
// the key longest, and until when.
func (c *checker) holder(rows []Row, r Row, timed bool) (Row, moment) {
	var holder Row
	held := moment{}
	for _, a := range rows {
		if !precedes(a, r, timed) {
			continue
		}
		if until := c.holds(a); held.before(until) {
			holder, held = a, until
		}
	}
	return holder, held
}

// precedes reports whether a must be first published before b, rows of
// one key: with times, a is earlier in b's transaction or committed before
// b was written; without, a is earlier in seq.
func precedes(a, b Row, timed bool) bool {
	return a.Seq < b.Seq && (!timed || a.Tx == b.Tx || a.Committed.Before(b.Written))
}

// why says why a precedes b.
func why(a, b Row, timed bool) string {
	switch {
	case !timed:
		return "earlier in seq"
	case a.Tx == b.Tx:
		return "earlier in the same transaction"
	}
	return fmt.Sprintf("committed at %s before seq %d was written at %s", stamp(a.Committed), b.Seq, stamp(b.Written))
}

// holds is until when r holds its key: its first publish or the moment it
// was freed, whichever came first; the zero moment for a row that never
// did either (it is Lost, reported as such).
func (c *checker) holds(r Row) moment {
	until := never
	if i, ok := c.first[r.ID]; ok {
		until = c.at(i)
	}
	if f, ok := c.freed[r.ID]; ok && f.before(until) {
		until = f
	}
	if until == never {
		return moment{}
	}
	return until
}

// fate says what became of a row that held its key.
func (c *checker) fate(r Row) string {
	i, ok := c.first[r.ID]
	switch f, freed := c.freed[r.ID]; {
	case freed && (!ok || f.before(c.at(i))):
		if at, purged := c.purged[r.ID]; purged && at.Equal(f.at) {
			return "purged at " + stamp(f.at)
		}
		return "rejected (a dead letter) at " + stamp(f.at)
	case ok:
		p := c.h.Published[i]
		return fmt.Sprintf("first published at %s by %s (partition %d, token %d)", stamp(p.At), p.Relay, p.Partition, p.LeaseToken)
	}
	return "never published"
}

// checkFences finds, per partition, publishes under a lease token made
// after a larger token's first publish of that partition.
func (c *checker) checkFences() {
	type first struct {
		token int64
		i     int
	}
	byPart := map[int][]int{}
	for i, p := range c.h.Published {
		if p.Partition >= 0 {
			byPart[p.Partition] = append(byPart[p.Partition], i)
		}
	}
	parts := make([]int, 0, len(byPart))
	for part := range byPart {
		parts = append(parts, part)
	}
	slices.Sort(parts)
	for _, part := range parts {
		idx := byPart[part]
		// The first publish under each token.
		firsts := map[int64]int{}
		for _, i := range idx {
			t := c.h.Published[i].LeaseToken
			if j, ok := firsts[t]; !ok || c.at(i).before(c.at(j)) {
				firsts[t] = i
			}
		}
		succ := make([]first, 0, len(firsts))
		for t, i := range firsts {
			succ = append(succ, first{t, i})
		}
		slices.SortFunc(succ, func(a, b first) int { return cmp.Compare(b.token, a.token) })
		// next[t] is the earliest first publish under a token above t:
		// the moment t's successors started. Walking the tokens down,
		// succ[j] becomes the earliest first publish of the tokens so far.
		next := map[int64]first{}
		for j, f := range succ {
			if j > 0 {
				next[f.token] = succ[j-1]
			}
			if j > 0 && c.at(succ[j-1].i).before(c.at(f.i)) {
				succ[j] = succ[j-1]
			}
		}
		for _, i := range idx {
			p := c.h.Published[i]
			s, ok := next[p.LeaseToken]
			if !ok || !c.at(s.i).before(c.at(i)) {
				continue
			}
			q := c.h.Published[s.i]
			c.add(Violation{Kind: StaleOwner, Key: p.Key, Seqs: []int64{p.Seq, q.Seq}, At: p.At,
				Detail: fmt.Sprintf("partition %d: %s under token %d published key %q seq %d (id %s) at %s, after %s under token %d first published key %q seq %d (id %s) at %s",
					part, p.Relay, p.LeaseToken, p.Key, p.Seq, p.ID, stamp(p.At), q.Relay, q.LeaseToken, q.Key, q.Seq, q.ID, stamp(q.At))})
		}
	}
}

// checkDelivery finds the rows owed a publish that never had one, or had
// their first one later than the bound.
func (c *checker) checkDelivery() {
	rows := make([]Row, 0, len(c.rows))
	for _, r := range c.rows {
		rows = append(rows, r)
	}
	slices.SortFunc(rows, func(a, b Row) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, r := range rows {
		if _, purged := c.purged[r.ID]; purged {
			continue
		}
		i, ok := c.first[r.ID]
		if !ok {
			c.add(Violation{Kind: Lost, Key: r.Key, Seqs: []int64{r.Seq},
				Detail: fmt.Sprintf("key %q seq %d (id %s) to %q was enqueued and never published (%s)", r.Key, r.Seq, r.ID, r.Destination, c.rejections(r.ID))})
			continue
		}
		if c.rules.Bound <= 0 {
			continue
		}
		from := c.rules.QuietFrom
		if r.Committed.After(from) {
			from = r.Committed
		}
		p := c.h.Published[i]
		if late := p.At.Sub(from); late > c.rules.Bound {
			c.add(Violation{Kind: Late, Key: r.Key, Seqs: []int64{r.Seq}, At: p.At,
				Detail: fmt.Sprintf("key %q seq %d (id %s) first published at %s by %s, %s after the faults stopped (or it was enqueued), beyond the bound of %s",
					r.Key, r.Seq, r.ID, stamp(p.At), p.Relay, late.Round(time.Millisecond), c.rules.Bound)})
		}
	}
}

// rejections says how often the Sinks rejected id.
func (c *checker) rejections(id uuid.UUID) string {
	n := 0
	for _, p := range c.h.Rejected {
		if p.ID == id {
			n++
		}
	}
	if n == 0 {
		return "never rejected"
	}
	return fmt.Sprintf("rejected %d times, never purged", n)
}

// describe names a publish or rejection (verb).
func describe(p Publish, verb string) string {
	return fmt.Sprintf("id %s (key %q, seq %d, destination %q) %s at %s by %s (partition %d, token %d)",
		p.ID, p.Key, p.Seq, p.Destination, verb, stamp(p.At), p.Relay, p.Partition, p.LeaseToken)
}

// stamp formats a moment of the history.
func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000000") }
