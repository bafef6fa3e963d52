package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/internal/outboxsql"
)

// DeadLetter is a message the relay gave up on: it failed permanently or
// too many times. It keeps the message's id, so a replayed message is still
// deduplicated downstream against any earlier delivery.
type DeadLetter struct {
	Message
	// Attempts counts the failed publishes.
	Attempts int
	// LastError is the error of the last attempt.
	LastError string
	// CreatedAt is when the message was enqueued.
	CreatedAt time.Time
	// FailedAt is when it became a dead letter.
	FailedAt time.Time
	// ErrorClass is the class of LastError (see [DeadGroup]);
	// [Unclassified] for a dead letter buried before classes were stored.
	ErrorClass string
}

// DeadFilter selects dead letters. Zero fields match everything; set fields
// must all match.
type DeadFilter struct {
	// IDs restricts the selection to these message ids.
	IDs []uuid.UUID
	// Destination matches exactly.
	Destination string
	// DestinationPrefix matches destinations that start with it.
	DestinationPrefix string
	// Key matches the ordering key exactly.
	Key string
	// KeyPrefix matches ordering keys that start with it.
	KeyPrefix string
	// ErrorClass matches dead letters of this class exactly (a
	// [DeadGroup]'s Class); [Unclassified] matches those stored without
	// one.
	ErrorClass string
	// FailedBefore matches dead letters older than this time (filter by
	// age: time.Now().Add(-age)).
	FailedBefore time.Time
	// FailedAfter matches dead letters that failed at or after this time:
	// replaying everything that failed since T is Replay with FailedAfter
	// T.
	FailedAfter time.Time
	// After lists (replays, purges) the dead letters enqueued after the
	// one with this id: pass the last ID of a page to get the next one
	// (keyset pagination through the id index and the primary key). An
	// id that is no longer a dead letter (replayed, purged) matches
	// nothing: start again from the first page.
	After uuid.UUID
	// Limit caps the number of dead letters listed, replayed or purged, in
	// enqueue order. For DeadLetters it defaults to 100; for Replay and
	// Purge zero means no limit.
	Limit int
	// All lets Replay and Purge act on every dead letter: without it they
	// refuse a filter that sets none of IDs, Destination,
	// DestinationPrefix, Key, KeyPrefix, ErrorClass, FailedBefore,
	// FailedAfter and After (idemq.ErrConfig), so that a value left empty
	// by mistake (a blank form field, an unset variable) never selects
	// everything. Listing needs no All. (inbox.DeadFilter has the same.)
	All bool
}

// selectsAll reports whether f narrows nothing: every dead letter, or the
// first Limit of them.
func (f DeadFilter) selectsAll() bool {
	return f.IDs == nil && f.Destination == "" && f.DestinationPrefix == "" && f.Key == "" && f.KeyPrefix == "" && f.ErrorClass == "" &&
		f.FailedBefore.IsZero() && f.FailedAfter.IsZero() && f.After == uuid.Nil
}

// validate refuses, with an error matching [idemq.ErrConfig], a filter
// that says one thing and would do another: a string field set to blanks
// (a form or a flag that sent " " looks like a filter, and a caller that
// trims it gets "no filter": everything), a NUL byte (Postgres cannot
// compare it, and answered with a raw SQLSTATE), or a negative Limit. An
// empty field is no filter, as the zero value is everywhere in idemq:
// callers that take a filter from people refuse empty values themselves
// (the idemq binary does).
func (f DeadFilter) validate() error {
	for field, v := range map[string]string{"Destination": f.Destination, "DestinationPrefix": f.DestinationPrefix,
		"Key": f.Key, "KeyPrefix": f.KeyPrefix, "ErrorClass": f.ErrorClass} {
		switch {
		case v != "" && strings.TrimSpace(v) == "":
			return idemq.NewConfigError("outbox.DeadFilter", field, "%q is blank: leave it empty for no filter on it, or give a value", v)
		case strings.ContainsRune(v, 0):
			return idemq.NewConfigError("outbox.DeadFilter", field, "%q holds a NUL byte, which no dead letter can match", v)
		}
	}
	if f.Limit < 0 {
		return idemq.NewConfigError("outbox.DeadFilter", "Limit", "%d is negative: leave it 0 for the default", f.Limit)
	}
	return nil
}

// args are the parameters of the dead-letter filter and limit
// (outboxsql.Queries.ListDead and LockDead).
func (f DeadFilter) args(defaultLimit int) []any {
	opt := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	optTime := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t
	}
	var ids any
	if f.IDs != nil {
		ids = f.IDs
	}
	var after any
	if f.After != uuid.Nil {
		after = f.After
	}
	var limit any
	if f.Limit > 0 {
		limit = f.Limit
	} else if defaultLimit > 0 {
		limit = defaultLimit
	}
	return []any{ids, opt(f.Destination), opt(f.DestinationPrefix), opt(f.Key), optTime(f.FailedBefore), optTime(f.FailedAfter),
		opt(f.ErrorClass), opt(f.KeyPrefix), limit, after}
}

// DeadLetters lists the dead letters that match f, oldest enqueued first.
func (o *Outbox) DeadLetters(ctx context.Context, f DeadFilter) ([]DeadLetter, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	rows, err := o.db.Query(ctx, o.q.ListDead, f.args(100)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		var headers []byte
		if err := row.Scan(&d.ID, &d.Destination, &d.Key, &d.Payload, &headers, &d.Attempts, &d.LastError, &d.CreatedAt, &d.FailedAt, &d.ErrorClass); err != nil {
			return d, err
		}
		// Headers that do not decode stay nil: the dead letter is still
		// listed, and its LastError says why it died.
		d.Headers, _ = outboxsql.DecodeHeaders(headers)
		return d, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	return out, nil
}

// Replay moves the dead letters that match f back to the outbox: due now,
// attempts reset, same id and the same place in their key's order (ahead of
// any later message of the key still pending). Followers a relay parked
// behind them (relay option ParkFollowers) are released once their key has
// no dead letter left. Replay returns the number of messages moved. A
// filter that selects everything must say f.All.
func (o *Outbox) Replay(ctx context.Context, f DeadFilter) (int64, error) {
	return inTx(ctx, o.db, func(tx pgx.Tx) (int64, error) { return o.ReplayTx(ctx, tx, f) })
}

// ReplayTx is [Outbox.Replay] in the caller's tx: the messages are back in
// the outbox if and only if tx commits.
func (o *Outbox) ReplayTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	n, err := o.settleDead(ctx, tx, f, o.q.Replay)
	if err != nil {
		return 0, fmt.Errorf("outbox: replay dead letters: %w", err)
	}
	return n, nil
}

// Purge deletes the dead letters that match f and returns how many it
// deleted. Followers parked behind them are released once their key has no
// dead letter left. A filter that selects everything must say f.All.
func (o *Outbox) Purge(ctx context.Context, f DeadFilter) (int64, error) {
	return inTx(ctx, o.db, func(tx pgx.Tx) (int64, error) { return o.PurgeTx(ctx, tx, f) })
}

// PurgeTx is [Outbox.Purge] in the caller's tx: the dead letters are gone
// if and only if tx commits.
func (o *Outbox) PurgeTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	n, err := o.settleDead(ctx, tx, f, o.q.Purge)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge dead letters: %w", err)
	}
	return n, nil
}

// settleDead runs stmt (Replay or Purge) on the dead letters that match f,
// after bumping the gens of their keys' partitions, then releases the
// followers parked behind them.
func (o *Outbox) settleDead(ctx context.Context, tx pgx.Tx, f DeadFilter, stmt string) (int64, error) {
	if nilcheck.IsNil(tx) {
		return 0, idemq.NewConfigError("outbox", "tx", "is nil: pass a transaction, or use the call without Tx")
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	if !f.All && f.selectsAll() {
		return 0, idemq.NewConfigError("outbox.DeadFilter", "All", "is false, and no other field narrows the selection: set IDs, Destination, "+
			"a Key, ErrorClass or a time (an empty value is no filter), or All to mean every dead letter")
	}
	seqs, keys, err := o.lockDead(ctx, tx, f, stmt == o.q.Replay)
	if err != nil || len(seqs) == 0 {
		return 0, err
	}
	tag, err := tx.Exec(ctx, stmt, seqs)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), o.unpark(ctx, tx, keys)
}

// lockDead locks the dead letters that match f, then bumps the gens of the
// partitions of their keys (all partitions if replay moves unkeyed rows
// back), and returns their seqs and distinct keys. The gen tells the relay
// that owns a partition to scan it again from its start, where the moved
// rows are; its batch in flight claims nothing once it sees the gen move
// (see outboxsql). Neither waits for the other: a transaction left open
// here stops no relay. While it is open the partitions it holds keep
// their owners (the relays skip them when they rebalance), so the
// partitions of a relay that died meanwhile wait for it to end.
func (o *Outbox) lockDead(ctx context.Context, tx pgx.Tx, f DeadFilter, replay bool) (seqs []int64, keys []string, err error) {
	rows, err := tx.Query(ctx, o.q.LockDead, f.args(0)...)
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	unkeyed := false
	for rows.Next() {
		var seq int64
		var key *string
		if err := rows.Scan(&seq, &key); err != nil {
			return nil, nil, err
		}
		seqs = append(seqs, seq)
		switch {
		case key == nil:
			unkeyed = true
		case !seen[*key]:
			seen[*key] = true
			keys = append(keys, *key)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	if len(keys) > 0 || (replay && unkeyed) {
		if _, err := tx.Exec(ctx, o.q.LockPartitions, keys, replay && unkeyed); err != nil {
			return nil, nil, err
		}
	}
	return seqs, keys, nil
}

// unpark releases the followers parked behind keys that have no dead letter
// left and wakes the relays.
func (o *Outbox) unpark(ctx context.Context, tx pgx.Tx, keys []string) error {
	if len(keys) > 0 {
		if _, err := tx.Exec(ctx, o.q.Unpark, keys); err != nil {
			return err
		}
	}
	if !o.cfg.DisableNotify {
		if _, err := tx.Exec(ctx, o.q.Notify, o.cfg.Channel); err != nil {
			return err
		}
	}
	return nil
}

// inTx runs fn in a transaction on db.
func inTx(ctx context.Context, db DB, fn func(pgx.Tx) (int64, error)) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) (err error) {
		n, err = fn(tx)
		return err
	})
	return n, err
}

// Stats is a snapshot of the outbox.
type Stats struct {
	// Pending counts the messages waiting to be published, including
	// those waiting for a retry, held or parked behind a dead letter.
	Pending int64
	// OldestPending is the age of the oldest pending message; zero when
	// nothing is pending.
	OldestPending time.Duration
	// Waiting counts the pending messages that are not due yet: waiting
	// for a retry, or held without an attempt (a webhook endpoint disabled
	// or behind an open breaker, a destination no route matches).
	Waiting int64
	// Parked counts the messages parked behind a dead letter of their key
	// (relay.Config.ParkFollowers) until it is replayed or purged.
	Parked int64
	// Unrouted counts the messages held because no route of the relay
	// matched their destination (relay.ErrNoRoute). They are among
	// Waiting.
	Unrouted int64
	// OldestDue is how long the longest-waiting message that is free to go
	// (due, and no message of its key waits for a retry) has been due. A
	// relay that keeps up keeps it near zero; a large value is a stall.
	OldestDue time.Duration
	// Dead counts the dead letters.
	Dead int64
}

// Stats counts pending messages and dead letters. It scans the tables, so
// call it every few seconds at most, not per message.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	var oldest, due *float64
	err := o.db.QueryRow(ctx, o.q.Stats, outboxsql.NoRoute).Scan(&s.Pending, &oldest, &s.Waiting, &s.Parked, &s.Unrouted, &due, &s.Dead)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	s.OldestPending, s.OldestDue = seconds(oldest), seconds(due)
	return s, nil
}

// seconds converts a number of seconds read from the database; NULL and
// negative values (clock skew between now() and clock_timestamp()) are 0.
func seconds(v *float64) time.Duration {
	if v == nil || *v <= 0 {
		return 0
	}
	return time.Duration(*v * float64(time.Second))
}
