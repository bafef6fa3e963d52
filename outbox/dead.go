package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DeadLetter is a message the relay gave up on: it failed permanently or
// too many times. It keeps the message's id, so a replayed message is still
// deduplicated downstream against any earlier delivery.
type DeadLetter struct {
	ID          uuid.UUID
	Destination string
	Key         string
	Payload     []byte
	Headers     map[string]string
	// Attempts counts the failed publishes.
	Attempts int
	// LastError is the error of the last attempt.
	LastError string
	CreatedAt time.Time
	FailedAt  time.Time
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
	// FailedBefore matches dead letters older than this time (filter by
	// age: time.Now().Add(-age)).
	FailedBefore time.Time
	// FailedAfter matches dead letters that failed at or after this time.
	FailedAfter time.Time
	// Limit caps the number of dead letters listed, replayed or purged, in
	// enqueue order. For DeadLetters it defaults to 100; for Replay and
	// Purge zero means no limit.
	Limit int
}

// deadWhere is the filter shared by list, replay and purge: static SQL
// whose parameters are NULL when a filter field is unset.
const deadWhere = `($1::uuid[] IS NULL OR id = ANY($1))
  AND ($2::text IS NULL OR destination = $2)
  AND ($3::text IS NULL OR starts_with(destination, $3))
  AND ($4::text IS NULL OR key = $4)
  AND ($5::timestamptz IS NULL OR failed_at < $5)
  AND ($6::timestamptz IS NULL OR failed_at >= $6)`

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
	var limit any
	if f.Limit > 0 {
		limit = f.Limit
	} else if defaultLimit > 0 {
		limit = defaultLimit
	}
	return []any{ids, opt(f.Destination), opt(f.DestinationPrefix), opt(f.Key), optTime(f.FailedBefore), optTime(f.FailedAfter), limit}
}

// DeadLetters lists the dead letters that match f, oldest enqueued first.
func (o *Outbox) DeadLetters(ctx context.Context, db DB, f DeadFilter) ([]DeadLetter, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("outbox: negative limit %d", f.Limit)
	}
	rows, err := db.Query(ctx, `SELECT id, destination, coalesce(key, ''), payload, headers, attempts, last_error, created_at, failed_at
FROM `+o.DeadTable()+` WHERE `+deadWhere+` ORDER BY seq LIMIT $7`, f.args(100)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := row.Scan(&d.ID, &d.Destination, &d.Key, &d.Payload, &d.Headers, &d.Attempts, &d.LastError, &d.CreatedAt, &d.FailedAt)
		return d, err
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
// no dead letter left. Replay returns the number of messages moved.
func (o *Outbox) Replay(ctx context.Context, db DB, f DeadFilter) (int64, error) {
	return o.moveDead(ctx, db, f, true)
}

// Purge deletes the dead letters that match f and returns how many it
// deleted. Followers parked behind them are released once their key has no
// dead letter left.
func (o *Outbox) Purge(ctx context.Context, db DB, f DeadFilter) (int64, error) {
	return o.moveDead(ctx, db, f, false)
}

func (o *Outbox) moveDead(ctx context.Context, db DB, f DeadFilter, replay bool) (int64, error) {
	what := "purge"
	if replay {
		what = "replay"
	}
	if f.Limit < 0 {
		return 0, fmt.Errorf("outbox: %s: negative limit %d", what, f.Limit)
	}
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// Lock the selected dead letters, then the keys they belong to (in
		// one order, so two replays never deadlock), then move them under a
		// fresh snapshot: a relay holding rows of such a key finishes first.
		rows, err := tx.Query(ctx, `SELECT seq, key FROM `+o.DeadTable()+` WHERE `+deadWhere+`
ORDER BY seq LIMIT $7 FOR UPDATE`, f.args(0)...)
		if err != nil {
			return err
		}
		var seqs []int64
		var keys []string
		seen := map[string]bool{}
		for rows.Next() {
			var seq int64
			var key *string
			if err := rows.Scan(&seq, &key); err != nil {
				return err
			}
			seqs = append(seqs, seq)
			if key != nil && !seen[*key] {
				seen[*key] = true
				keys = append(keys, *key)
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(seqs) == 0 {
			return nil
		}
		if len(keys) > 0 {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, h)
FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($2::text[]) AS k ORDER BY 1) AS l`, o.lockClass, keys); err != nil {
				return err
			}
		}
		if replay {
			tag, err := tx.Exec(ctx, `WITH moved AS (
  DELETE FROM `+o.DeadTable()+` WHERE seq = ANY($1)
  RETURNING seq, id, created_at, destination, payload, key, headers, last_error)
INSERT INTO `+o.Table()+` (seq, id, created_at, available_at, attempts, destination, payload, key, headers, last_error)
SELECT seq, id, created_at, now(), 0, destination, payload, key, headers, last_error FROM moved`, seqs)
			if err != nil {
				return err
			}
			n = tag.RowsAffected()
		} else {
			tag, err := tx.Exec(ctx, `DELETE FROM `+o.DeadTable()+` WHERE seq = ANY($1)`, seqs)
			if err != nil {
				return err
			}
			n = tag.RowsAffected()
		}
		if len(keys) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE `+o.Table()+` AS o SET available_at = now()
WHERE o.key = ANY($1) AND o.available_at = 'infinity'
  AND NOT EXISTS (SELECT 1 FROM `+o.DeadTable()+` AS d WHERE d.key = o.key)`, keys); err != nil {
				return err
			}
		}
		if o.notify {
			if _, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, o.channel); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: %s dead letters: %w", what, err)
	}
	return n, nil
}

// Stats is a snapshot of the outbox.
type Stats struct {
	// Pending counts the messages waiting to be published, including
	// those waiting for a retry or parked behind a dead letter.
	Pending int64
	// OldestPending is the age of the oldest pending message; zero when
	// nothing is pending.
	OldestPending time.Duration
	// Dead counts the dead letters.
	Dead int64
}

// Stats counts pending messages and dead letters. It scans the tables, so
// call it every few seconds at most, not per message.
func (o *Outbox) Stats(ctx context.Context, db DB) (Stats, error) {
	var s Stats
	var oldest *float64
	err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+o.Table()+`),
  (SELECT extract(epoch FROM clock_timestamp() - min(created_at))::float8 FROM `+o.Table()+`),
  (SELECT count(*) FROM `+o.DeadTable()+`)`).Scan(&s.Pending, &oldest, &s.Dead)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != nil && *oldest > 0 {
		s.OldestPending = time.Duration(*oldest * float64(time.Second))
	}
	return s, nil
}
