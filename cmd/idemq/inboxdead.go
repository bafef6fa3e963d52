package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/inbox"
)

// inboxDead is an inbox dead letter or, with --conflicts, a conflict, as
// the dlq commands print it.
type inboxDead struct {
	Scope     string    `json:"scope"`
	Key       string    `json:"key"`
	Failures  int       `json:"failures,omitempty"`
	Seen      int       `json:"seen,omitempty"` // conflicts: deliveries of the conflicting message
	LastError string    `json:"last_error,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	FailedAt  time.Time `json:"failed_at"` // conflicts: last seen
}

// inboxFilter is the filter the flags select among inbox dead letters.
func (o *dlqOptions) inboxFilter() inbox.DeadFilter {
	f := inbox.DeadFilter{Scope: o.scope, Key: o.key, ErrorClass: o.class, Limit: o.limit}
	f.FailedBefore, f.FailedAfter = o.failedWindow()
	return f
}

// inboxDeadLetters lists what the flags select: dead letters, or conflicts.
func (o *dlqOptions) inboxDeadLetters(ctx context.Context, ib *inbox.Store, f inbox.DeadFilter) ([]inboxDead, error) {
	out := []inboxDead{}
	if o.conflicts {
		cs, err := ib.Conflicts(ctx, f)
		for _, c := range cs {
			out = append(out, inboxDead{Scope: c.Scope, Key: c.Key, Seen: c.Seen, CreatedAt: c.CreatedAt, FailedAt: c.UpdatedAt,
				LastError: fmt.Sprintf("conflict: fingerprint %x differs from the applied message's", c.Fingerprint)})
		}
		return out, err
	}
	recs, err := ib.DeadLetters(ctx, f)
	for _, r := range recs {
		out = append(out, inboxDead{Scope: r.Scope, Key: r.Key, Failures: r.Failures, LastError: r.LastError, CreatedAt: r.CreatedAt, FailedAt: r.UpdatedAt})
	}
	return out, err
}

// inboxDeadRows prints inbox dead letters or conflicts as a table.
func inboxDeadRows(t *table, dead []inboxDead) {
	t.header("SCOPE", "KEY", "FAILURES", "FAILED", "ERROR")
	for _, d := range dead {
		t.row(d.Scope, d.Key, fmt.Sprint(d.Failures), age(d.FailedAt)+" ago", clip(d.LastError, 80))
	}
}

// inboxNoun names what the flags select in the inbox.
func (o *dlqOptions) inboxNoun() string {
	if o.conflicts {
		return "conflicts"
	}
	return "inbox dead letters"
}

func inboxDeadShow(ctx context.Context, cmd *cli.Command, o *dlqOptions) error {
	if cmd.Args().Len() != 2 {
		return usageError("dlq show --inbox: want SCOPE KEY")
	}
	scope, key := cmd.Args().Get(0), cmd.Args().Get(1)
	set, done, err := openDeadSet(ctx, cmd, o)
	if err != nil {
		return err
	}
	defer done()
	dead, err := o.inboxDeadLetters(ctx, set.ib, inbox.DeadFilter{Scope: scope, Key: key})
	if errors.Is(err, inbox.ErrInvalidKey) {
		return usageError("%w", err)
	}
	if err != nil {
		return err
	}
	if len(dead) == 0 {
		return withCode(exitNotFound, "no inbox dead letter or conflict for scope %q key %q", scope, key)
	}
	d := dead[0]
	return output(cmd, d, func(t *table) {
		t.row("scope", d.Scope)
		t.row("key", d.Key)
		t.row("failures", fmt.Sprint(d.Failures))
		t.row("created", timestamp(d.CreatedAt))
		t.row("failed", timestamp(d.FailedAt))
		t.row("error", d.LastError)
	})
}
