package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/inboxsql"
)

// ExpiredLeases is the leased claims of one scope whose lease ran out
// while they were still IN_PROGRESS: their holder died or stalled, and the
// next delivery of each key takes it over.
type ExpiredLeases struct {
	Scope string
	// Count is the number of expired leases read, at most the limit
	// passed to [Store.ExpiredLeases]; Capped says there are more.
	Count  int
	Capped bool
	// OldestExpiry is when the oldest of them ran out.
	OldestExpiry time.Time
	// SampleKey, SampleOwner and SampleToken are the key, the holder and
	// the fencing token of the oldest one.
	SampleKey   string
	SampleOwner string
	SampleToken int64
}

// ExpiredLeases reports, per scope with any, the records IN_PROGRESS
// whose lease_until has passed, oldest expiry first. It reads at most
// limit+1 entries per scope (limit defaults to 1000) from a partial index
// that holds only the records in progress (migration 0007), so it costs
// the same at any table size; a scope with more than limit says Capped.
func (s *Store) ExpiredLeases(ctx context.Context, limit int) ([]ExpiredLeases, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.core().DB().Query(ctx, s.core().Admin().ExpiredLeases, limit+1)
	if err != nil {
		return nil, fmt.Errorf("inbox: expired leases: %w", inboxsql.NotMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ExpiredLeases, error) {
		var e ExpiredLeases
		var n int64
		err := row.Scan(&e.Scope, &n, &e.OldestExpiry, &e.SampleKey, &e.SampleOwner, &e.SampleToken)
		e.Count = int(n)
		if e.Count > limit {
			e.Count, e.Capped = limit, true
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: expired leases: %w", inboxsql.NotMigrated(err))
	}
	return out, nil
}
