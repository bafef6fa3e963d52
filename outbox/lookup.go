package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// PendingMessage is a message still in the outbox, as [Outbox.PendingByKey]
// lists it: where it stands, without its payload.
type PendingMessage struct {
	ID          uuid.UUID
	Destination string
	// Attempts counts its failed publishes so far.
	Attempts int
	// CreatedAt is when it was enqueued; AvailableAt when it is due (in
	// the past: due now), zero when Parked.
	CreatedAt, AvailableAt time.Time
	// Parked reports that it waits behind a dead letter of its key until
	// a replay or a purge releases it.
	Parked bool
	// LastError is the error of its last failed publish, or why it is held.
	LastError string
}

// PendingWindow is how many of the oldest rows of a key's partition
// [Outbox.PendingByKey] searches. The outbox has no index on the key
// (every enqueue would pay for one), so a lookup reads its partition in
// seq order; the oldest rows are the ones a stuck key holds up.
const PendingWindow = 20000

// PendingByKey lists up to limit (0: 100) messages of key still in the
// outbox, in their key's order, among the oldest PendingWindow rows of the
// key's partition (the (partition, seq) index): on a large backlog a
// message of the key further back is not listed.
func (o *Outbox) PendingByKey(ctx context.Context, key string, limit int) ([]PendingMessage, error) {
	if key == "" {
		return nil, fmt.Errorf("outbox: pending by key: empty key")
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := o.db.Query(ctx, o.q.ByKey, key, limit, PendingWindow)
	if err != nil {
		return nil, fmt.Errorf("outbox: pending by key: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PendingMessage, error) {
		var m PendingMessage
		var seq int64
		var available pgtype.Timestamptz
		err := row.Scan(&seq, &m.ID, &m.Destination, &m.Attempts, &m.CreatedAt, &available, &m.LastError)
		m.AvailableAt, m.Parked = available.Time, available.InfinityModifier == pgtype.Infinity
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: pending by key: %w", err)
	}
	return out, nil
}
