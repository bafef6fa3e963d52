package main

import (
	"context"
	"encoding/json"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
)

// groupJSON is a dead-letter group as dlq groups prints it: Destination
// for the outbox's, Scope for the inbox's.
type groupJSON struct {
	ID          string    `json:"id"`
	Class       string    `json:"class"`
	Destination string    `json:"destination,omitempty"`
	Scope       string    `json:"scope,omitempty"`
	Count       int64     `json:"count"`
	FirstFailed time.Time `json:"first_failed"`
	LastFailed  time.Time `json:"last_failed"`
	Sample      string    `json:"sample"` // outbox: message id; inbox: key
	SampleError string    `json:"sample_error"`
}

// groups returns the set's groups (the filter's --limit caps them).
func (s *deadSet) groups(ctx context.Context) ([]groupJSON, error) {
	var out []groupJSON
	if s.ob != nil {
		gs, err := s.ob.DeadGroups(ctx, s.of)
		for _, g := range gs {
			out = append(out, groupJSON{ID: g.ID, Class: g.Class, Destination: g.Destination, Count: g.Count,
				FirstFailed: g.FirstFailed, LastFailed: g.LastFailed, Sample: g.SampleID.String(), SampleError: g.SampleError})
		}
		return out, err
	}
	gs, err := s.ib.DeadGroups(ctx, s.inf)
	for _, g := range gs {
		out = append(out, groupJSON{ID: g.ID, Class: g.Class, Scope: g.Scope, Count: g.Count,
			FirstFailed: g.FirstFailed, LastFailed: g.LastFailed, Sample: g.SampleKey, SampleError: g.SampleError})
	}
	return out, err
}

// selectGroup narrows the filter to the group --group names: its class and
// destination (scope). No group with that id is exitNotFound.
func (s *deadSet) selectGroup(ctx context.Context) error {
	if s.o.group == "" {
		return nil
	}
	id := strings.ToLower(strings.TrimSpace(s.o.group))
	all := *s
	all.of, all.inf = outbox.DeadFilter{Limit: 100000}, inbox.DeadFilter{Limit: 100000}
	groups, err := all.groups(ctx)
	if err != nil {
		return err
	}
	var found []groupJSON
	for _, g := range groups {
		if strings.HasPrefix(g.ID, id) {
			found = append(found, g)
		}
	}
	switch {
	case len(found) == 0:
		return withCode(exitNotFound, "no dead-letter group %s (dlq groups lists them); nothing changed", id)
	case len(found) > 1:
		return usageError("--group %s: %d groups start with it, give more digits", id, len(found))
	}
	g := found[0]
	if s.ob != nil {
		if s.of.Destination != "" && s.of.Destination != g.Destination {
			return usageError("--group %s is on destination %q, not %q", id, g.Destination, s.of.Destination)
		}
		s.of.Destination, s.of.ErrorClass = g.Destination, g.Class
		return nil
	}
	if s.inf.Scope != "" && s.inf.Scope != g.Scope {
		return usageError("--group %s is in scope %q, not %q", id, g.Scope, s.inf.Scope)
	}
	s.inf.Scope, s.inf.ErrorClass = g.Scope, g.Class
	return nil
}

// audit writes a move of n dead letters to the outbox's audit log in tx.
// A database whose outbox tables do not exist (an inbox alone) keeps no
// log: the move stands.
func (s *deadSet) audit(ctx context.Context, tx pgx.Tx, purge bool, n int64) error {
	if s.audited == nil {
		return nil
	}
	action := map[bool]string{false: "replay", true: "purge"}[purge]
	var filter any = s.of
	prefix := "outbox."
	if s.ib != nil {
		prefix, filter = "inbox.", s.inf
		if s.o.conflicts {
			prefix = "inbox.conflicts."
		}
		if !purge {
			action = "release"
		}
	}
	raw, err := json.Marshal(filter)
	if err != nil {
		return err
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, auditTable(s.audited)).Scan(&exists); err != nil || !exists {
		return err
	}
	return s.audited.RecordAuditTx(ctx, tx, outbox.AuditEntry{Actor: cliActor(), Action: prefix + action,
		Target: s.o.group, Filter: raw, Rows: n})
}

// auditTable is the quoted name of ob's audit log.
func auditTable(ob *outbox.Outbox) string {
	c := ob.Config()
	return pgx.Identifier{c.Schema, c.Table + "_audit"}.Sanitize()
}

// cliActor names the person running the binary in the audit log.
func cliActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return "cli:" + name + "@" + host
}

func dlqGroups(ctx context.Context, cmd *cli.Command, o *dlqOptions) error {
	set, done, err := openDeadSet(ctx, cmd, o)
	if err != nil {
		return err
	}
	defer done()
	groups, err := set.groups(ctx)
	if err != nil {
		return err
	}
	if groups == nil {
		groups = []groupJSON{}
	}
	return output(cmd, groups, func(t *table) {
		where := "DESTINATION"
		if set.ib != nil {
			where = "SCOPE"
		}
		t.header("GROUP", where, "COUNT", "FIRST", "LAST", "CLASS")
		for _, g := range groups {
			t.row(g.ID, g.Destination+g.Scope, itoa(g.Count), age(g.FirstFailed)+" ago", age(g.LastFailed)+" ago", clip(g.Class, 100))
		}
		t.note("%d groups of %s", len(groups), set.noun())
	})
}

// dlqClassify classifies, in batches, the dead letters stored without an
// error class.
func dlqClassify(ctx context.Context, cmd *cli.Command, o *dlqOptions) error {
	set, done, err := openDeadSet(ctx, cmd, o)
	if err != nil {
		return err
	}
	defer done()
	var total int64
	for {
		var n int64
		if set.ob != nil {
			n, err = set.ob.ClassifyDead(ctx, 1000)
		} else {
			n, err = set.ib.ClassifyDead(ctx, 1000)
		}
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		total += n
	}
	return output(cmd, map[string]int64{"classified": total}, func(t *table) { t.note("classified %d %s", total, set.noun()) })
}
