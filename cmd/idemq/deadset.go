package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
)

// deadSet is what the dlq flags select: outbox dead letters, or with
// --inbox the consumers' dead letters (with --conflicts, their conflicts),
// and the moves replay and purge make on them.
type deadSet struct {
	cmd  *cli.Command // for the global flags and the output
	o    *dlqOptions
	pool *pgxpool.Pool
	ob   *outbox.Outbox // nil with --inbox
	of   outbox.DeadFilter
	ib   *inbox.Store // nil without --inbox
	inf  inbox.DeadFilter
	keys []string // with --inbox, the keys --id names (each one's set is inf with that Key)
	// audited is the outbox whose audit log records the moves.
	audited *outbox.Outbox
}

// openDeadSet reads the filter flags, refusing bad ones before it
// connects; done closes the pool.
func openDeadSet(ctx context.Context, cmd *cli.Command, o *dlqOptions) (s *deadSet, done func(), err error) {
	s = &deadSet{cmd: cmd, o: o}
	if o.inbox {
		s.inf, s.keys = o.inboxFilter(), o.ids
	} else if s.of, err = o.outboxFilter(); err != nil {
		return nil, nil, err
	}
	if s.pool, err = connect(ctx, cmd); err != nil {
		return nil, nil, err
	}
	ob, ib, err := stores(cmd, s.pool)
	if err != nil {
		s.pool.Close()
		return nil, nil, err
	}
	if o.inbox {
		s.ib = ib
	} else {
		s.ob = ob
	}
	s.audited = ob
	if err := s.checkTables(ctx, ob, ib); err != nil {
		s.pool.Close()
		return nil, nil, err
	}
	if err := s.selectGroup(ctx); err != nil {
		s.pool.Close()
		return nil, nil, err
	}
	return s, s.pool.Close, nil
}

// checkTables says, when the dead letters the flags name have no table
// here, whether the other kind has one: on a consumer's database without
// an outbox, dlq groups said to migrate where the answer is --inbox (as
// idemq stats says).
func (s *deadSet) checkTables(ctx context.Context, ob *outbox.Outbox, ib *inbox.Store) error {
	oc, ic := ob.Config(), ib.Config()
	outboxHere, err := tableExists(ctx, s.pool, oc.Schema, oc.Table+"_dead")
	if err != nil {
		return err
	}
	inboxHere, err := tableExists(ctx, s.pool, ic.Schema, ic.Table)
	switch {
	case err != nil:
		return err
	case s.ob != nil && !outboxHere && inboxHere:
		return withCode(exitPending, "no outbox tables in schema %q, only the inbox's: add --inbox for the consumers' dead letters "+
			"(or run `idemq migrate --components outbox` if this service has an outbox)", oc.Schema)
	case s.ib != nil && !inboxHere && outboxHere:
		return withCode(exitPending, "no inbox table in schema %q, only the outbox's: drop --inbox for the relay's dead letters "+
			"(or run `idemq migrate --components inbox` if this service has consumers)", ic.Schema)
	}
	return nil
}

// noun names what the set holds.
func (s *deadSet) noun() string {
	if s.ob != nil {
		return "outbox dead letters"
	}
	return s.o.inboxNoun()
}

// list returns the first --limit (default 100) of the set, for JSON and
// as table rows.
func (s *deadSet) list(ctx context.Context) (rows any, human func(*table), n int, err error) {
	if s.ob != nil {
		dead, err := s.ob.DeadLetters(ctx, s.of)
		return jsonDead(dead), func(t *table) { outboxDeadRows(t, dead) }, len(dead), err
	}
	var dead []inboxDead
	for _, f := range s.inboxFilters() {
		d, err := s.o.inboxDeadLetters(ctx, s.ib, f)
		if err != nil {
			return nil, nil, 0, err
		}
		dead = append(dead, d...)
	}
	if dead == nil {
		dead = []inboxDead{}
	}
	return dead, func(t *table) { inboxDeadRows(t, dead) }, len(dead), nil
}

// inboxFilters is the inbox filter, or with --id one filter per key.
func (s *deadSet) inboxFilters() []inbox.DeadFilter {
	if len(s.keys) == 0 {
		return []inbox.DeadFilter{s.inf}
	}
	fs := make([]inbox.DeadFilter, len(s.keys))
	for i, k := range s.keys {
		fs[i] = s.inf
		fs[i].Key = k
	}
	return fs
}

// move replays (releases, in the inbox) or purges the set in tx.
func (s *deadSet) move(ctx context.Context, tx pgx.Tx, purge bool) (int64, error) {
	if s.ob != nil && purge {
		return s.ob.PurgeTx(ctx, tx, s.of)
	} else if s.ob != nil {
		return s.ob.ReplayTx(ctx, tx, s.of)
	}
	move := s.ib.ReleaseTx
	if purge {
		move = s.ib.PurgeTx
	}
	var total int64
	for _, f := range s.inboxFilters() {
		// The command shows the selection and asks first; its flags refuse
		// empty values, so a filter with none set means everything.
		f.Conflicts, f.All = s.o.conflicts, true
		n, err := move(ctx, tx, f)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// rehearse runs fn in a transaction that it rolls back, and returns the
// database's time when that transaction began.
func (s *deadSet) rehearse(ctx context.Context, fn func(pgx.Tx) error) (time.Time, error) {
	var at time.Time
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return at, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a rehearsal: nothing is kept
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&at); err != nil {
		return at, err
	}
	return at, fn(tx)
}

// failedBefore narrows the set to what failed before at.
func (s *deadSet) failedBefore(at time.Time) {
	for _, before := range []*time.Time{&s.of.FailedBefore, &s.inf.FailedBefore} {
		if before.IsZero() || at.Before(*before) {
			*before = at
		}
	}
}

// checkIDs returns an exitNotFound error, before anything changes, when an
// --id names no outbox dead letter among those the other flags select.
func (s *deadSet) checkIDs(ctx context.Context) error {
	if s.ib != nil {
		return s.checkInboxKeys(ctx)
	}
	if len(s.of.IDs) == 0 {
		return nil
	}
	f := s.of
	f.Limit = len(f.IDs)
	dead, err := s.ob.DeadLetters(ctx, f)
	if err != nil {
		return err
	}
	found := map[uuid.UUID]bool{}
	for _, d := range dead {
		found[d.ID] = true
	}
	var missing []string
	for _, id := range s.of.IDs {
		if !found[id] {
			missing = append(missing, id.String())
		}
	}
	if len(missing) > 0 {
		return withCode(exitNotFound, "no outbox dead letter with id %s matches; nothing changed", strings.Join(missing, ", "))
	}
	return nil
}

// checkInboxKeys is checkIDs for the inbox keys --inbox --id names.
func (s *deadSet) checkInboxKeys(ctx context.Context) error {
	var missing []string
	for _, f := range s.inboxFilters()[:len(s.keys)] {
		f.Limit = 1
		dead, err := s.o.inboxDeadLetters(ctx, s.ib, f)
		if errors.Is(err, inbox.ErrInvalidKey) {
			return usageError("--id %q: %w", f.Key, err)
		}
		if err != nil {
			return err
		}
		if len(dead) == 0 {
			missing = append(missing, strconv.Quote(f.Key))
		}
	}
	if len(missing) > 0 {
		return withCode(exitNotFound, "no %s with key %s matches; nothing changed", s.noun(), strings.Join(missing, ", "))
	}
	return nil
}

// dryRun prints what a move would change: the count, and the set as dlq
// list shows it.
func (s *deadSet) dryRun(ctx context.Context, verb string, n int64) error {
	rows, human, listed, err := s.list(ctx)
	if err != nil {
		return err
	}
	what := s.o.describe()
	return output(s.cmd, map[string]any{"would_have_" + verb: n, "dead_letters": rows}, func(t *table) {
		human(t)
		if int64(listed) < n {
			t.note("(the first %d listed)", listed)
		}
		t.note("dry run: would have %s %d %s %s; nothing changed", verb, n, s.noun(), what)
	})
}

// outboxDeadRows prints outbox dead letters as a table.
func outboxDeadRows(t *table, dead []outbox.DeadLetter) {
	t.header("ID", "DESTINATION", "KEY", "ATTEMPTS", "FAILED", "ERROR")
	for _, d := range dead {
		t.row(d.ID.String(), d.Destination, d.Key, fmt.Sprint(d.Attempts), age(d.FailedAt)+" ago", clip(d.LastError, 80))
	}
}
