package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v3"
)

// statsReport is what idemq stats prints. A part whose tables are not
// migrated is absent, and named in NotMigrated.
type statsReport struct {
	*OutboxStats
	*InboxStats
	// WebhookEndpoints and WebhookDisabled are absent when the webhook
	// tables were not migrated.
	WebhookEndpoints *int     `json:"webhook_endpoints,omitempty"`
	WebhookDisabled  *int     `json:"webhook_endpoints_disabled,omitempty"`
	NotMigrated      []string `json:"not_migrated,omitempty"`
}

// OutboxStats is the outbox's part of [statsReport] (exported for
// encoding/json, which fills embedded pointers only of exported types).
type OutboxStats struct {
	OutboxPending       int64   `json:"outbox_pending"`
	OutboxOldestPending float64 `json:"outbox_oldest_pending_seconds"`
	OutboxWaiting       int64   `json:"outbox_waiting"`
	OutboxParked        int64   `json:"outbox_parked"`
	OutboxUnrouted      int64   `json:"outbox_unrouted"`
	OutboxOldestDue     float64 `json:"outbox_oldest_due_seconds"`
	OutboxDead          int64   `json:"outbox_dead_letters"`
}

// InboxStats is the inbox's part of [statsReport].
type InboxStats struct {
	InboxRecords    int64   `json:"inbox_records"`
	InboxInProgress int64   `json:"inbox_in_progress"`
	InboxRetrying   int64   `json:"inbox_failed_retryable"`
	InboxDead       int64   `json:"inbox_dead_letters"`
	InboxOldestDead float64 `json:"inbox_oldest_dead_letter_seconds"`
	InboxConflicts  int64   `json:"inbox_conflicts"`
}

func statsCommand() *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "outbox backlog and oldest pending age, held and unrouted messages, dead letters, inbox size, disabled webhook endpoints",
		Description: "The counts scan the outbox and the inbox: call it every few seconds at most. The webhook counts appear\n" +
			"once the webhook tables are migrated.\n" +
			"outbox waiting: not due yet (a retry's backoff, or held: a disabled webhook endpoint, an open breaker, no route).\n" +
			"outbox unrouted: held because no --route matches their destination; deploy the route: they go out within 30s.\n" +
			"outbox oldest due: how long the longest-waiting message free to go has been due; large means a stall.\n" +
			"With --databases-from: one line per database of the fleet from the outbox's gauges (index edges and a sample,\n" +
			"no scan): backlog, how long the longest-due row has been due, and the relay workers alive there.",
		Flags:  fleetFlags(),
		Action: runStats,
	}
}

func runStats(ctx context.Context, cmd *cli.Command) error {
	if src, closeCatalog, err := fleetSource(ctx, cmd); err != nil || src != nil {
		if err != nil {
			return err
		}
		defer closeCatalog()
		return statsFleet(ctx, cmd, src)
	}
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
	var r statsReport
	switch obs, err := ob.Stats(ctx); {
	case isMissing(err):
		r.NotMigrated = append(r.NotMigrated, "outbox")
	case err != nil:
		return err
	default:
		r.OutboxStats = &OutboxStats{OutboxPending: obs.Pending, OutboxOldestPending: obs.OldestPending.Seconds(), OutboxDead: obs.Dead,
			OutboxWaiting: obs.Waiting, OutboxParked: obs.Parked, OutboxUnrouted: obs.Unrouted, OutboxOldestDue: obs.OldestDue.Seconds()}
	}
	switch ibs, err := ib.Stats(ctx); {
	case isMissing(err):
		r.NotMigrated = append(r.NotMigrated, "inbox")
	case err != nil:
		return err
	default:
		r.InboxStats = &InboxStats{
			InboxRecords:    ibs.Succeeded + ibs.InProgress + ibs.FailedRetryable + ibs.Dead,
			InboxInProgress: ibs.InProgress, InboxRetrying: ibs.FailedRetryable, InboxDead: ibs.Dead,
			InboxOldestDead: ibs.OldestDead.Seconds(), InboxConflicts: ibs.Conflicts,
		}
	}
	if len(r.NotMigrated) == 2 {
		return withCode(exitPending, "neither the outbox nor the inbox tables exist in schema %q: run `idemq migrate`", globals(cmd).schema)
	}
	var migrated bool
	endpoints := pgx.Identifier{globals(cmd).schema, globals(cmd).webhookTable}.Sanitize()
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
		if o := r.OutboxStats; o != nil {
			t.row("outbox pending", itoa(o.OutboxPending))
			t.row("outbox oldest pending", secondsText(o.OutboxOldestPending, time.Millisecond))
			t.row("outbox waiting (backoff or held)", itoa(o.OutboxWaiting))
			t.row("outbox parked", itoa(o.OutboxParked))
			t.row("outbox unrouted", itoa(o.OutboxUnrouted))
			t.row("outbox oldest due", secondsText(o.OutboxOldestDue, time.Millisecond))
			t.row("outbox dead letters", itoa(o.OutboxDead))
		}
		if i := r.InboxStats; i != nil {
			t.row("inbox records", itoa(i.InboxRecords))
			t.row("inbox in progress", itoa(i.InboxInProgress))
			t.row("inbox failed, retrying", itoa(i.InboxRetrying))
			t.row("inbox dead letters", itoa(i.InboxDead))
			t.row("inbox oldest dead letter", secondsText(i.InboxOldestDead, time.Second))
			t.row("inbox conflicts", itoa(i.InboxConflicts))
		}
		if migrated {
			t.row("webhook endpoints", itoa(int64(*r.WebhookEndpoints)))
			t.row("webhook endpoints disabled", itoa(int64(*r.WebhookDisabled)))
		}
		for _, c := range r.NotMigrated {
			t.note("%s: not migrated (run `idemq migrate --components %s` if this service uses it)", c, c)
		}
	})
}

// secondsText formats seconds as a duration rounded to unit.
func secondsText(seconds float64, unit time.Duration) string {
	return time.Duration(seconds * float64(time.Second)).Round(unit).String()
}

// isMissing reports whether err says a table does not exist.
func isMissing(err error) bool {
	_, ok := missingTable(err)
	return ok
}
