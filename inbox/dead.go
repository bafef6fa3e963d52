package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"

	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
)

// DeadFilter selects inbox dead letters (FAILED_FINAL records) or, with
// Conflicts, recorded conflicts, as outbox.DeadFilter selects the
// outbox's dead letters. Zero fields match everything; set fields must
// all match. For conflicts the times are when a conflict was last seen.
type DeadFilter struct {
	// Conflicts makes Release and Purge act on the recorded conflicts
	// instead of the dead letters (see [Store.Release]); ErrorClass must
	// then be empty, since conflicts have no class.
	Conflicts bool
	// Scope matches the consumer's scope exactly.
	Scope string
	// Key matches the idempotency key exactly.
	Key string
	// ErrorClass matches dead letters of this class exactly (a
	// [DeadGroup]'s Class); [Unclassified] matches those stored without
	// one.
	ErrorClass string
	// FailedBefore matches dead letters older than this time (filter by
	// age: time.Now().Add(-age)).
	FailedBefore time.Time
	// FailedAfter matches dead letters that failed at or after this time.
	FailedAfter time.Time
	// Limit caps the number of dead letters listed, released or purged,
	// oldest first. For DeadLetters it defaults to 100; for Release and
	// Purge zero means no limit.
	Limit int
	// All lets Release and Purge act on every dead letter (or conflict):
	// without it they refuse a filter that sets none of Scope, Key,
	// ErrorClass, FailedBefore and FailedAfter (idemq.ErrConfig), so that
	// a value left empty by mistake (a blank form field, an unset flag)
	// never selects everything. Listing needs no All.
	All bool
}

// checkChange refuses a Release or Purge of everything that does not say
// All.
func (f DeadFilter) checkChange() error {
	if !f.All && f.Scope == "" && f.Key == "" && f.ErrorClass == "" && f.FailedBefore.IsZero() && f.FailedAfter.IsZero() {
		return idemq.NewConfigError("inbox", "DeadFilter", "selects every dead letter or conflict: set Scope, Key, ErrorClass or a time (an empty value is no filter), or All to mean everything")
	}
	return nil
}

func (f DeadFilter) args(defaultLimit int) ([]any, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("inbox: negative limit %d", f.Limit)
	}
	if f.Conflicts && f.ErrorClass != "" {
		return nil, fmt.Errorf("inbox: a filter of conflicts has no ErrorClass (got %q): conflicts have no class", f.ErrorClass)
	}
	var scope, key, before, after, limit any
	if f.Scope != "" {
		scope = f.Scope
	}
	if f.Key != "" {
		id, _ := inboxsql.KeyID(f.Key)
		key = id
	}
	if !f.FailedBefore.IsZero() {
		before = f.FailedBefore
	}
	if !f.FailedAfter.IsZero() {
		after = f.FailedAfter
	}
	if n := cmp.Or(f.Limit, defaultLimit); n > 0 {
		limit = n
	}
	return []any{scope, key, before, after, limit}, nil
}

// deadArgs are args and the error class ($6), for the statements on dead
// letters; what lists dead letters refuses a filter of conflicts.
func (f DeadFilter) deadArgs(defaultLimit int) ([]any, error) {
	if f.Conflicts {
		return nil, errors.New("inbox: DeadFilter.Conflicts selects conflicts: list them with Store.Conflicts")
	}
	args, err := f.args(defaultLimit)
	if err != nil {
		return nil, err
	}
	var class any
	if f.ErrorClass != "" {
		class = f.ErrorClass
	}
	return append(args, class), nil
}

// DeadLetters lists the dead letters that match f, oldest first. A
// record's UpdatedAt is when it became a dead letter, LastError why.
func (s *Store) DeadLetters(ctx context.Context, f DeadFilter) ([]Record, error) {
	args, err := f.deadArgs(100)
	if err != nil {
		return nil, err
	}
	rows, err := s.core().DB().Query(ctx, s.core().Admin().ListDead, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", inboxsql.NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var scope string
		var id uuid.UUID
		var text *string
		var rec inboxsql.Scan
		var class string
		if err := row.Scan(append(append([]any{&scope, &id, &text}, rec.Dest()...), &class)...); err != nil {
			return Record{}, err
		}
		key := id.String()
		if text != nil {
			key = *text
		}
		r := rec.Record(scope, key)
		r.ErrorClass = class
		return r, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", inboxsql.NotMigrated(err))
	}
	return out, nil
}

// Release turns the dead letters that match f back into failed attempts
// with no failure counted (FAILED_RETRYABLE): the next delivery of each
// message is applied, and its retries start afresh. It returns the number
// released. A filter that selects everything must say f.All.
//
// With f.Conflicts it releases the conflicts that match f instead: the
// operator says the conflicting payload (the latest, if a key has
// several) is a message of its own that reused the key, to be applied
// once. Each key's record then stands for that payload, as a failed
// attempt with no failure counted, so its next delivery is applied and
// later ones are duplicates. The payload the key was applied with before
// stays applied: its redeliveries are duplicates, never applied again and
// never a new conflict (Record.Superseded keeps its fingerprint). A
// payload the key held without applying it (a dead letter, a failed
// attempt) is let go: its deliveries now conflict. A third payload
// conflicts as before. A key held by a leased worker is left alone.
func (s *Store) Release(ctx context.Context, f DeadFilter) (int64, error) {
	return s.change(ctx, s.core().DB(), f, false)
}

// ReleaseTx is [Store.Release] in the caller's tx: the dead letters (or
// conflicts) are released if and only if tx commits.
func (s *Store) ReleaseTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	if pgtx.IsNil(tx) {
		return 0, inboxsql.ErrNilTx
	}
	return s.change(ctx, tx, f, false)
}

// Purge deletes the dead letters that match f and returns how many it
// deleted. A purged key is forgotten: a later delivery of its message is
// applied as a new one. A filter that selects everything must say f.All.
// With f.Conflicts it deletes the conflicts that
// match f instead, leaving the keys' records as they are.
func (s *Store) Purge(ctx context.Context, f DeadFilter) (int64, error) {
	return s.change(ctx, s.core().DB(), f, true)
}

// PurgeTx is [Store.Purge] in the caller's tx: the dead letters (or
// conflicts) are gone if and only if tx commits.
func (s *Store) PurgeTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	if pgtx.IsNil(tx) {
		return 0, inboxsql.ErrNilTx
	}
	return s.change(ctx, tx, f, true)
}

// change releases or purges what f selects on db: dead letters (with the
// error class parameter) or conflicts.
func (s *Store) change(ctx context.Context, db DB, f DeadFilter, purge bool) (int64, error) {
	if err := f.checkChange(); err != nil {
		return 0, err
	}
	admin := s.core().Admin()
	if f.Conflicts {
		args, err := f.args(0)
		if err != nil {
			return 0, err
		}
		if purge {
			return exec(ctx, db, "purge conflicts", admin.PurgeConflicts, args)
		}
		// Its statement counts the released conflicts, not the records it
		// rewrites.
		var n int64
		if err := db.QueryRow(ctx, admin.ReleaseConflicts, args...).Scan(&n); err != nil {
			return 0, fmt.Errorf("inbox: release conflicts: %w", inboxsql.NotMigrated(err))
		}
		return n, nil
	}
	args, err := f.deadArgs(0)
	if err != nil {
		return 0, err
	}
	if purge {
		return exec(ctx, db, "purge dead letters", admin.PurgeDead, args)
	}
	return exec(ctx, db, "release dead letters", admin.ReleaseDead, args)
}

// exec runs sql on db and returns the rows it changed.
func exec(ctx context.Context, db DB, what, sql string, args []any) (int64, error) {
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("inbox: %s: %w", what, inboxsql.NotMigrated(err))
	}
	return tag.RowsAffected(), nil
}

// Stats counts the inbox's records by status.
type Stats struct {
	// Succeeded counts applied messages, kept to recognise redeliveries.
	Succeeded int64
	// InProgress counts keys held by leased workers.
	InProgress int64
	// FailedRetryable counts messages whose last attempt failed and that
	// wait for a redelivery or a retry.
	FailedRetryable int64
	// Dead counts dead letters.
	Dead int64
	// OldestDead is the age of the oldest dead letter; zero when there is
	// none.
	OldestDead time.Duration
	// Conflicts counts the recorded conflicts (see [Store.Conflicts]).
	Conflicts int64
}

// Stats counts the records by status and the conflicts. It scans the
// tables, so call it every few seconds at most, not per message.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	rows, err := s.core().DB().Query(ctx, s.core().Admin().Stats)
	if err != nil {
		return Stats{}, fmt.Errorf("inbox: stats: %w", inboxsql.NotMigrated(err))
	}
	var st Stats
	var status Status
	var n int64
	var oldest *time.Time
	_, err = pgx.ForEachRow(rows, []any{&status, &n, &oldest}, func() error {
		switch status {
		case 0: // the conflicts table
			st.Conflicts = n
		case Succeeded:
			st.Succeeded = n
		case InProgress:
			st.InProgress = n
		case FailedRetryable:
			st.FailedRetryable = n
		case FailedFinal:
			st.Dead, st.OldestDead = n, max(time.Since(*oldest), 0)
		}
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("inbox: stats: %w", inboxsql.NotMigrated(err))
	}
	return st, nil
}

// Conflict is a message that was not applied because its key was recorded
// with another fingerprint (a *ConflictError). Its payload is not kept:
// the fingerprint identifies it, and its transport's dead-letter copy
// carries it.
type Conflict struct {
	Scope string
	Key   string
	// Fingerprint is the conflicting message's.
	Fingerprint []byte
	// Seen counts its deliveries; CreatedAt and UpdatedAt are the first and
	// the last.
	Seen      int
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Conflicts lists the conflicts that match f, least recently seen first;
// f.Conflicts need not be set. Release and Purge with f.Conflicts release
// and purge them.
func (s *Store) Conflicts(ctx context.Context, f DeadFilter) ([]Conflict, error) {
	args, err := f.args(100)
	if err != nil {
		return nil, err
	}
	rows, err := s.core().DB().Query(ctx, s.core().Admin().ListConflicts, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list conflicts: %w", inboxsql.NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Conflict, error) {
		var c Conflict
		var id uuid.UUID
		var text *string
		if err := row.Scan(&c.Scope, &id, &text, &c.Fingerprint, &c.Seen, &c.CreatedAt, &c.UpdatedAt); err != nil {
			return Conflict{}, err
		}
		c.Key = id.String()
		if text != nil {
			c.Key = *text
		}
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: list conflicts: %w", inboxsql.NotMigrated(err))
	}
	return out, nil
}
