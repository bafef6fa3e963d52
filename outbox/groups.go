package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/internal/outboxsql"
)

// Unclassified is the error class of dead letters buried before the
// outbox stored classes (migration 0003), until [Outbox.ClassifyDead]
// classifies them.
const Unclassified = outboxsql.Unclassified

// DeadGroup is the dead letters of one destination that failed for one
// cause: their error class. A class is the last error's text with its
// variable parts (ids, numbers, addresses, times, quoted values) replaced
// by placeholders such as <uuid> and <n>, prefixed with the error type the
// text names: "http 5xx: ", "sqlstate 23505: ", "kafka 6: ".
type DeadGroup struct {
	// ID names the group in a short stable form (12 hex digits of a hash
	// of its class and destination), for `idemq dlq replay --group ID`
	// and links; [Outbox.DeadGroup] resolves it.
	ID string
	// Class is the error class; [Unclassified] for rows stored without
	// one.
	Class string
	// Destination is the dead letters' destination.
	Destination string
	// Count is the number of dead letters in the group.
	Count int64
	// FirstFailed and LastFailed are the earliest and the latest failure.
	FirstFailed, LastFailed time.Time
	// SampleID and SampleError are the id and the last error of the
	// group's oldest dead letter.
	SampleID    uuid.UUID
	SampleError string
}

// Filter returns the filter that selects the group's dead letters: pass
// it to Replay, Purge or DeadLetters.
func (g DeadGroup) Filter() DeadFilter {
	return DeadFilter{Destination: g.Destination, ErrorClass: g.Class}
}

// GroupID is the ID of the group of class and destination.
func GroupID(class, destination string) string {
	h := sha256.Sum256([]byte(class + "\x00" + destination))
	return hex.EncodeToString(h[:6])
}

// DeadGroups groups the dead letters that match f by error class and
// destination, most numerous first. f.Limit caps the number of groups
// (default 100); f.IDs, the key and time fields narrow the dead letters
// counted. Without them (a filter of destination, destination prefix and
// error class at most) it reads the groups' summary that the dead-letter
// table's triggers keep (migration 0006): a few rows, whatever the number
// of dead letters; with them it reads the (error_class, destination, seq)
// index of the dead letters they select.
func (o *Outbox) DeadGroups(ctx context.Context, f DeadFilter) ([]DeadGroup, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	args := f.args(100)
	stmt := o.q.DeadGroups
	if f.summarized() {
		// destination, destination prefix, class, limit
		stmt, args = o.q.GroupSummary, []any{args[1], args[2], args[6], args[8]}
	}
	rows, err := o.db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: group dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadGroup, error) {
		var g DeadGroup
		var class *string
		if err := row.Scan(&class, &g.Destination, &g.Count, &g.FirstFailed, &g.LastFailed, &g.SampleID, &g.SampleError); err != nil {
			return g, err
		}
		g.Class = Unclassified
		if class != nil {
			g.Class = *class
		}
		g.ID = GroupID(g.Class, g.Destination)
		return g, nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: group dead letters: %w", err)
	}
	return out, nil
}

// DeadSince counts the dead letters that failed at or after since, per
// destination (destinations with none are left out). It reads the
// (failed_at) INCLUDE (destination) index of migration 0006 for the rows
// since then, not the rows themselves: cheap for the recent past.
func (o *Outbox) DeadSince(ctx context.Context, since time.Time) (map[string]int64, error) {
	return o.countBy(ctx, "count recent dead letters", o.q.DeadSince, since)
}

// Parked counts the rows parked behind a dead letter of their key (relay
// option ParkFollowers), per destination (destinations with none are left
// out): exactly, from the partial index of migration 0007 that holds only
// parked rows, where [Gauges] counts those of its sample.
func (o *Outbox) Parked(ctx context.Context) (map[string]int64, error) {
	return o.countBy(ctx, "count parked rows", o.q.Parked)
}

// countBy runs stmt, which returns (destination, count) rows.
func (o *Outbox) countBy(ctx context.Context, what, stmt string, args ...any) (map[string]int64, error) {
	rows, err := o.db.Query(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", what, err)
	}
	out := map[string]int64{}
	var dest string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&dest, &n}, func() error {
		out[dest] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", what, err)
	}
	return out, nil
}

// summarized reports whether f selects whole groups: then the summary of
// migration 0006 counts them.
func (f DeadFilter) summarized() bool {
	return f.IDs == nil && f.Key == "" && f.KeyPrefix == "" && f.FailedBefore.IsZero() && f.FailedAfter.IsZero() && f.After == uuid.Nil
}

// ErrNoGroup is matched by the error of [Outbox.DeadGroup] when no group
// has the id.
var ErrNoGroup = fmt.Errorf("outbox: no dead-letter group with that id")

// DeadGroup returns the group whose ID is id (or starts with it, at least 6
// hex digits), among all dead letters. It fails with an error matching
// [ErrNoGroup] when none has it, or when the prefix names several.
func (o *Outbox) DeadGroup(ctx context.Context, id string) (DeadGroup, error) {
	id = strings.ToLower(strings.TrimSpace(id))
	if len(id) < 6 {
		return DeadGroup{}, fmt.Errorf("%w %q: give at least 6 hex digits of the id idemq dlq groups shows", ErrNoGroup, id)
	}
	groups, err := o.DeadGroups(ctx, DeadFilter{Limit: 100000})
	if err != nil {
		return DeadGroup{}, err
	}
	var found []DeadGroup
	for _, g := range groups {
		if strings.HasPrefix(g.ID, id) {
			found = append(found, g)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return DeadGroup{}, fmt.Errorf("%w %q (its dead letters may have been replayed or purged)", ErrNoGroup, id)
	default:
		return DeadGroup{}, fmt.Errorf("%w %q alone: %d groups start with it, give more digits", ErrNoGroup, id, len(found))
	}
}

// ClassifyDead stores the error class of up to batch dead letters buried
// without one (before migration 0003), computed from their stored error
// text, and returns how many it classified; call it until it returns 0.
// batch 0 means 1000. Safe to run beside relays: it only fills in NULLs.
func (o *Outbox) ClassifyDead(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	rows, err := o.db.Query(ctx, o.q.Unclassified, batch)
	if err != nil {
		return 0, fmt.Errorf("outbox: classify dead letters: %w", err)
	}
	var seqs []int64
	var texts []string
	var seq int64
	var text string
	if _, err := pgx.ForEachRow(rows, []any{&seq, &text}, func() error {
		seqs, texts = append(seqs, seq), append(texts, text)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("outbox: classify dead letters: %w", err)
	}
	if len(seqs) == 0 {
		return 0, nil
	}
	tag, err := o.db.Exec(ctx, o.q.Classify, seqs, errclass.All(texts))
	if err != nil {
		return 0, fmt.Errorf("outbox: classify dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}
