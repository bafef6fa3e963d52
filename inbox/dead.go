package inbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
)

// DeadFilter selects inbox dead letters (FAILED_FINAL records) or
// conflicts, as outbox.DeadFilter selects the outbox's dead letters. Zero
// fields match everything; set fields must all match. For conflicts the
// times are when a conflict was last seen.
type DeadFilter struct {
	// Scope matches the consumer's scope exactly.
	Scope string
	// Key matches the idempotency key exactly.
	Key string
	// FailedBefore matches dead letters older than this time (filter by
	// age: time.Now().Add(-age)).
	FailedBefore time.Time
	// FailedAfter matches dead letters that failed at or after this time.
	FailedAfter time.Time
	// Limit caps the number of dead letters listed, released or purged,
	// oldest first. For DeadLetters it defaults to 100; for Release and
	// Purge zero means no limit.
	Limit int
}

func (f DeadFilter) args(defaultLimit int) ([]any, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("inbox: negative limit %d", f.Limit)
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

// DeadLetters lists the dead letters that match f, oldest first. A
// record's UpdatedAt is when it became a dead letter, LastError why.
func (s *Store) DeadLetters(ctx context.Context, f DeadFilter) ([]Record, error) {
	args, err := f.args(100)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.sql.listDead, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", inboxsql.NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var scope string
		var id uuid.UUID
		var text *string
		var rec inboxsql.Scan
		if err := row.Scan(append([]any{&scope, &id, &text}, rec.Dest()...)...); err != nil {
			return Record{}, err
		}
		key := id.String()
		if text != nil {
			key = *text
		}
		return Record(rec.Row(scope, key)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters: %w", inboxsql.NotMigrated(err))
	}
	return out, nil
}

// Release turns the dead letters that match f back into failed attempts
// with no failure counted (FAILED_RETRYABLE): the next delivery of each
// message is applied, and its retries start afresh. It returns the number
// released.
func (s *Store) Release(ctx context.Context, f DeadFilter) (int64, error) {
	return s.changeDead(ctx, s.db, f, s.sql.releaseDead, "release dead letters")
}

// ReleaseTx is [Store.Release] in the caller's tx: the dead letters are
// released if and only if tx commits.
func (s *Store) ReleaseTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	if pgtx.IsNil(tx) {
		return 0, inboxsql.ErrNilTx
	}
	return s.changeDead(ctx, tx, f, s.sql.releaseDead, "release dead letters")
}

// Purge deletes the dead letters that match f and returns how many it
// deleted. A purged key is forgotten: a later delivery of its message is
// applied as a new one.
func (s *Store) Purge(ctx context.Context, f DeadFilter) (int64, error) {
	return s.changeDead(ctx, s.db, f, s.sql.purgeDead, "purge dead letters")
}

// PurgeTx is [Store.Purge] in the caller's tx: the dead letters are gone if
// and only if tx commits.
func (s *Store) PurgeTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	if pgtx.IsNil(tx) {
		return 0, inboxsql.ErrNilTx
	}
	return s.changeDead(ctx, tx, f, s.sql.purgeDead, "purge dead letters")
}

func (s *Store) changeDead(ctx context.Context, db DB, f DeadFilter, sql, what string) (int64, error) {
	args, err := f.args(0)
	if err != nil {
		return 0, err
	}
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
	rows, err := s.db.Query(ctx, s.sql.stats)
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

// Conflicts lists the conflicts that match f, least recently seen first.
func (s *Store) Conflicts(ctx context.Context, f DeadFilter) ([]Conflict, error) {
	args, err := f.args(100)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, s.sql.listConflicts, args...)
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

// ReleaseConflicts accepts the conflicting messages that match f: the
// operator says the conflicting payload (the latest, if a key has several)
// is a message of its own that reused the key, to be applied once. Each
// key's record then stands for that payload, as a failed attempt with no
// failure counted, so its next delivery is applied and later ones are
// duplicates. The payload the key was applied with before stays applied:
// its redeliveries are duplicates, never applied again and never a new
// conflict (Record.Superseded keeps its fingerprint). A payload the key
// held without applying it (a dead letter, a failed attempt) is let go:
// its deliveries now conflict. A third payload conflicts as before. A key
// held by a leased worker is left alone. It returns the number released.
func (s *Store) ReleaseConflicts(ctx context.Context, f DeadFilter) (int64, error) {
	return s.releaseConflicts(ctx, s.db, f)
}

// ReleaseConflictsTx is [Store.ReleaseConflicts] in the caller's tx: the
// conflicts are released if and only if tx commits.
func (s *Store) ReleaseConflictsTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	if pgtx.IsNil(tx) {
		return 0, inboxsql.ErrNilTx
	}
	return s.releaseConflicts(ctx, tx, f)
}

func (s *Store) releaseConflicts(ctx context.Context, db DB, f DeadFilter) (int64, error) {
	args, err := f.args(0)
	if err != nil {
		return 0, err
	}
	var n int64
	if err := db.QueryRow(ctx, s.sql.releaseConflicts, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: release conflicts: %w", inboxsql.NotMigrated(err))
	}
	return n, nil
}

// PurgeConflicts deletes the conflicts that match f, leaving the keys'
// records as they are, and returns how many it deleted.
func (s *Store) PurgeConflicts(ctx context.Context, f DeadFilter) (int64, error) {
	return s.changeDead(ctx, s.db, f, s.sql.purgeConflicts, "purge conflicts")
}

// PurgeConflictsTx is [Store.PurgeConflicts] in the caller's tx: the
// conflicts are gone if and only if tx commits.
func (s *Store) PurgeConflictsTx(ctx context.Context, tx pgx.Tx, f DeadFilter) (int64, error) {
	if pgtx.IsNil(tx) {
		return 0, inboxsql.ErrNilTx
	}
	return s.changeDead(ctx, tx, f, s.sql.purgeConflicts, "purge conflicts")
}
