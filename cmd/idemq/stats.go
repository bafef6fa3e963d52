package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v3"
)

// statsReport is what idemq stats prints.
type statsReport struct {
	OutboxPending       int64   `json:"outbox_pending"`
	OutboxOldestPending float64 `json:"outbox_oldest_pending_seconds"`
	OutboxWaiting       int64   `json:"outbox_waiting"`
	OutboxParked        int64   `json:"outbox_parked"`
	OutboxUnrouted      int64   `json:"outbox_unrouted"`
	OutboxOldestDue     float64 `json:"outbox_oldest_due_seconds"`
	OutboxDead          int64   `json:"outbox_dead_letters"`
	InboxRecords        int64   `json:"inbox_records"`
	InboxInProgress     int64   `json:"inbox_in_progress"`
	InboxRetrying       int64   `json:"inbox_failed_retryable"`
	InboxDead           int64   `json:"inbox_dead_letters"`
	InboxOldestDead     float64 `json:"inbox_oldest_dead_letter_seconds"`
	InboxConflicts      int64   `json:"inbox_conflicts"`
	// WebhookEndpoints and WebhookDisabled are absent when the webhook
	// tables were not migrated.
	WebhookEndpoints *int `json:"webhook_endpoints,omitempty"`
	WebhookDisabled  *int `json:"webhook_endpoints_disabled,omitempty"`
}

func statsCommand() *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "outbox backlog and oldest pending age, held and unrouted messages, dead letters, inbox size, disabled webhook endpoints",
		Description: "The counts scan the outbox and the inbox: call it every few seconds at most. The webhook counts appear\n" +
			"once the webhook tables are migrated.\n" +
			"outbox waiting: not due yet (a retry's backoff, or held: a disabled webhook endpoint, an open breaker, no route).\n" +
			"outbox unrouted: held because no --route matches their destination; deploy the route: they go out within 30s.\n" +
			"outbox oldest due: how long the longest-waiting message free to go has been due; large means a stall.",
		Action: runStats,
	}
}

func runStats(ctx context.Context, cmd *cli.Command) error {
	pool, err := connect(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, ib, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	reg, err := registry(cmd, pool)
	if err != nil {
		return err
	}
	obs, err := ob.Stats(ctx)
	if err != nil {
		return err
	}
	ibs, err := ib.Stats(ctx)
	if err != nil {
		return err
	}
	r := statsReport{
		OutboxPending: obs.Pending, OutboxOldestPending: obs.OldestPending.Seconds(), OutboxDead: obs.Dead,
		OutboxWaiting: obs.Waiting, OutboxParked: obs.Parked, OutboxUnrouted: obs.Unrouted, OutboxOldestDue: obs.OldestDue.Seconds(),
		InboxRecords:    ibs.Succeeded + ibs.InProgress + ibs.FailedRetryable + ibs.Dead,
		InboxInProgress: ibs.InProgress, InboxRetrying: ibs.FailedRetryable, InboxDead: ibs.Dead,
		InboxOldestDead: ibs.OldestDead.Seconds(), InboxConflicts: ibs.Conflicts,
	}
	var migrated bool
	endpoints := pgx.Identifier{cmd.String(flagSchema), cmd.String(flagWebhookTable)}.Sanitize()
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, endpoints).Scan(&migrated); err != nil {
		return err
	}
	if migrated {
		eps, err := reg.List(ctx)
		if err != nil {
			return err
		}
		disabled := 0
		for _, e := range eps {
			if !e.Enabled() {
				disabled++
			}
		}
		total := len(eps)
		r.WebhookEndpoints, r.WebhookDisabled = &total, &disabled
	}
	return output(cmd, r, func(t *table) {
		t.row("outbox pending", itoa(r.OutboxPending))
		t.row("outbox oldest pending", obs.OldestPending.Round(time.Millisecond).String())
		t.row("outbox waiting (backoff or held)", itoa(r.OutboxWaiting))
		t.row("outbox parked", itoa(r.OutboxParked))
		t.row("outbox unrouted", itoa(r.OutboxUnrouted))
		t.row("outbox oldest due", obs.OldestDue.Round(time.Millisecond).String())
		t.row("outbox dead letters", itoa(r.OutboxDead))
		t.row("inbox records", itoa(r.InboxRecords))
		t.row("inbox in progress", itoa(r.InboxInProgress))
		t.row("inbox failed, retrying", itoa(r.InboxRetrying))
		t.row("inbox dead letters", itoa(r.InboxDead))
		t.row("inbox oldest dead letter", ibs.OldestDead.Round(time.Second).String())
		t.row("inbox conflicts", itoa(r.InboxConflicts))
		if migrated {
			t.row("webhook endpoints", itoa(int64(*r.WebhookEndpoints)))
			t.row("webhook endpoints disabled", itoa(int64(*r.WebhookDisabled)))
		}
	})
}
