package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/nilcheck"
)

// AuditEntry is one operator action in the outbox's audit log (table
// <outbox>_audit): who did what, to which rows, when.
type AuditEntry struct {
	// ID numbers the entries in the order written.
	ID int64
	// At is when the action committed; set by the database.
	At time.Time
	// Actor is who acted: "ui:alice", "cli:root@host".
	Actor string
	// Action names the action: "outbox.replay", "outbox.purge",
	// "inbox.release", "webhook.enable".
	Action string
	// Target names what the action was on: a group id, an endpoint id.
	Target string
	// Filter is the selection the action applied, as JSON (a DeadFilter
	// marshalled, for instance).
	Filter json.RawMessage
	// Rows is how many rows the action changed.
	Rows int64
	// Outcome says what came of the action: "done", "nothing to do",
	// "failed: <error>" (outbox migration 0005). Empty for entries
	// written without one.
	Outcome string
}

// RecordAuditTx writes e to the audit log in tx, so that the entry exists
// if and only if the action it records commits. At and ID are set by the
// database; an empty Filter is stored as {}.
func (o *Outbox) RecordAuditTx(ctx context.Context, tx pgx.Tx, e AuditEntry) error {
	if nilcheck.IsNil(tx) {
		return errors.New("outbox: record audit: nil tx; pass a transaction")
	}
	if e.Actor == "" || e.Action == "" {
		return errors.New("outbox: record audit: Actor and Action are required")
	}
	filter := e.Filter
	if len(filter) == 0 {
		filter = json.RawMessage("{}")
	}
	if _, err := tx.Exec(ctx, o.q.Audit, e.Actor, e.Action, e.Target, string(filter), e.Rows, e.Outcome); err != nil {
		return fmt.Errorf("outbox: record audit: %w", err)
	}
	return nil
}

// AuditLog returns up to limit entries of the audit log (0: 100), latest
// first, older than the entry with id before (0: from the latest): pass
// the last ID of a page to get the next.
func (o *Outbox) AuditLog(ctx context.Context, before int64, limit int) ([]AuditEntry, error) {
	if limit <= 0 {
		limit = 100
	}
	var beforeArg any
	if before > 0 {
		beforeArg = before
	}
	rows, err := o.db.Query(ctx, o.q.AuditLog, beforeArg, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: audit log: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		var filter []byte
		err := row.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.Target, &filter, &e.Rows, &e.Outcome)
		e.Filter = filter
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: audit log: %w", err)
	}
	return out, nil
}

// MarshalJSON writes the fields of f that are set, in snake case: the
// form the audit log stores ({"destination":"billing","error_class":"…"}).
func (f DeadFilter) MarshalJSON() ([]byte, error) {
	type opt struct {
		IDs               []uuid.UUID `json:"ids,omitempty"`
		Destination       string      `json:"destination,omitempty"`
		DestinationPrefix string      `json:"destination_prefix,omitempty"`
		Key               string      `json:"key,omitempty"`
		KeyPrefix         string      `json:"key_prefix,omitempty"`
		ErrorClass        string      `json:"error_class,omitempty"`
		FailedBefore      *time.Time  `json:"failed_before,omitempty"`
		FailedAfter       *time.Time  `json:"failed_after,omitempty"`
		Limit             int         `json:"limit,omitempty"`
		After             *uuid.UUID  `json:"after,omitempty"`
		All               bool        `json:"all,omitempty"`
	}
	o := opt{IDs: f.IDs, Destination: f.Destination, DestinationPrefix: f.DestinationPrefix, Key: f.Key, KeyPrefix: f.KeyPrefix,
		ErrorClass: f.ErrorClass, Limit: f.Limit, All: f.All && f.selectsAll()}
	if !f.FailedBefore.IsZero() {
		o.FailedBefore = &f.FailedBefore
	}
	if !f.FailedAfter.IsZero() {
		o.FailedAfter = &f.FailedAfter
	}
	if f.After != uuid.Nil {
		o.After = &f.After
	}
	return json.Marshal(o)
}
