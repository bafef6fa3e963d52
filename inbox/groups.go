package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/internal/inboxsql"
)

// Unclassified is the error class of dead letters stored without one
// (dead-lettered before migration 0006, or by a leased worker's Fail),
// until [Store.ClassifyDead] classifies them.
const Unclassified = errclass.Unclassified

// DeadGroup is the dead letters of one scope that failed for one cause:
// their error class, the last error's text with its variable parts (ids,
// numbers, addresses, times, quoted values) replaced by placeholders and
// prefixed with the error type the text names ("http 5xx: ",
// "sqlstate 23505: ").
type DeadGroup struct {
	// ID names the group in a short stable form (12 hex digits of a hash
	// of its class and scope).
	ID string
	// Class is the error class; [Unclassified] for records stored
	// without one.
	Class string
	// Scope is the consumer's scope.
	Scope string
	// Count is the number of dead letters in the group.
	Count int64
	// FirstFailed and LastFailed are the earliest and the latest failure.
	FirstFailed, LastFailed time.Time
	// SampleKey and SampleError are the key and the last error of the
	// group's oldest dead letter.
	SampleKey   string
	SampleError string
}

// Filter returns the filter that selects the group's dead letters: pass
// it to Release, Purge or DeadLetters.
func (g DeadGroup) Filter() DeadFilter {
	return DeadFilter{Scope: g.Scope, ErrorClass: g.Class}
}

// DeadGroups groups the dead letters that match f by error class and
// scope, most numerous first. f.Limit caps the number of groups (default
// 100). It reads the partial index of dead letters, not the table.
func (s *Store) DeadGroups(ctx context.Context, f DeadFilter) ([]DeadGroup, error) {
	args, err := f.deadArgs(100)
	if err != nil {
		return nil, err
	}
	rows, err := s.core().DB().Query(ctx, s.core().Admin().DeadGroups, args...)
	if err != nil {
		return nil, fmt.Errorf("inbox: group dead letters: %w", inboxsql.NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadGroup, error) {
		var g DeadGroup
		var class, text, lastErr *string
		var id uuid.UUID
		if err := row.Scan(&class, &g.Scope, &g.Count, &g.FirstFailed, &g.LastFailed, &id, &text, &lastErr); err != nil {
			return g, err
		}
		g.Class, g.SampleKey = Unclassified, id.String()
		if class != nil {
			g.Class = *class
		}
		if text != nil {
			g.SampleKey = *text
		}
		if lastErr != nil {
			g.SampleError = *lastErr
		}
		h := sha256.Sum256([]byte(g.Class + "\x00" + g.Scope))
		g.ID = hex.EncodeToString(h[:6])
		return g, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: group dead letters: %w", inboxsql.NotMigrated(err))
	}
	return out, nil
}

// ClassifyDead stores the error class of up to batch dead letters stored
// without one, computed from their last error, and returns how many it
// classified; call it until it returns 0. batch 0 means 1000.
func (s *Store) ClassifyDead(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	rows, err := s.core().DB().Query(ctx, s.core().Admin().Unclassified, batch)
	if err != nil {
		return 0, fmt.Errorf("inbox: classify dead letters: %w", inboxsql.NotMigrated(err))
	}
	var scopes []int32
	var ids []uuid.UUID
	var texts []string
	var scope int32
	var id uuid.UUID
	var text string
	if _, err := pgx.ForEachRow(rows, []any{&scope, &id, &text}, func() error {
		scopes, ids, texts = append(scopes, scope), append(ids, id), append(texts, text)
		return nil
	}); err != nil {
		return 0, fmt.Errorf("inbox: classify dead letters: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	tag, err := s.core().DB().Exec(ctx, s.core().Admin().Classify, scopes, ids, errclass.All(texts))
	if err != nil {
		return 0, fmt.Errorf("inbox: classify dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}
