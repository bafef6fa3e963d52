package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/outbox"
)

// component is a set of idemq tables with its own migrations.
type component struct {
	name   string // "outbox", "inbox", "webhook"
	schema string
	table  string
	// open builds the component's store on db, a pool or a transaction.
	open func(db outbox.DB) (migrator, error)
}

// migrator is what every component's store offers for its tables.
type migrator interface {
	Migrate(context.Context) error
	PendingMigrations(context.Context) ([]string, error)
}

// owner is the key under which the library's migrator records the
// component's versions in <schema>.idemq_migrations.
func (c component) owner() string { return c.name + ":" + c.schema + "." + c.table }

// migration is one row of the migration log, applied or pending.
type migration struct {
	Component string     `json:"component"`
	Schema    string     `json:"schema"`
	Table     string     `json:"table"`
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	AppliedAt *time.Time `json:"applied_at"` // nil while pending
}

const flagComponents = "components"

func componentsFlag(defaults ...string) cli.Flag {
	return &cli.StringSliceFlag{Name: flagComponents, Value: defaults,
		Usage: "which tables: outbox, inbox, webhook", Sources: cli.EnvVars("IDEMQ_COMPONENTS")}
}

// allComponents returns every component, by name.
func allComponents(cmd *cli.Command) map[string]component {
	schema := cmd.String(flagSchema)
	return map[string]component{
		"outbox": {name: "outbox", schema: schema, table: cmd.String(flagOutboxTable),
			open: func(db outbox.DB) (migrator, error) {
				ob, _, err := stores(cmd, db)
				return ob, err
			}},
		"inbox": {name: "inbox", schema: schema, table: cmd.String(flagInboxTable),
			open: func(db outbox.DB) (migrator, error) {
				_, ib, err := stores(cmd, db)
				return ib, err
			}},
		"webhook": {name: "webhook", schema: schema, table: cmd.String(flagWebhookTable),
			open: func(db outbox.DB) (migrator, error) {
				return registry(cmd, db)
			}},
	}
}

// components returns the components the command names.
func components(cmd *cli.Command) ([]component, error) {
	all := allComponents(cmd)
	var out []component
	for _, name := range cmd.StringSlice(flagComponents) {
		for name := range strings.SplitSeq(name, ",") {
			c, ok := all[strings.TrimSpace(name)]
			if !ok {
				return nil, usageError("--%s: unknown component %q (want outbox, inbox or webhook)", flagComponents, name)
			}
			out = append(out, c)
		}
	}
	return out, nil
}

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "apply the migrations of the idemq tables",
		Description: "Applies what is pending, each component in one transaction, safely from several processes at once.\n" +
			"'migrate list' shows every migration and whether it is applied; 'migrate validate' exits 4 while any is pending, and reports each outbox's seq sequence:\n" +
			"it exits 1 when its CACHE is above 1 or it is below the seqs in use, which break the relay's order.",
		Flags:  []cli.Flag{componentsFlag("outbox", "inbox")},
		Action: migrateUp,
		Commands: []*cli.Command{
			{Name: "list", Usage: "list applied and pending migrations", Flags: []cli.Flag{componentsFlag("outbox", "inbox")}, Action: migrateList},
			{Name: "validate", Usage: "exit 4 while migrations are pending, 1 if the outbox's sequence breaks the relay's order", Flags: []cli.Flag{componentsFlag("outbox", "inbox")}, Action: migrateValidate},
		},
	}
}

func migrateUp(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Present() {
		return usageError("migrate: unknown subcommand %q (want list or validate)", cmd.Args().First())
	}
	pool, comps, err := connectComponents(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	before, err := readMigrationLog(ctx, pool, comps)
	if err != nil {
		return err
	}
	if err := applyMigrations(ctx, pool, comps); err != nil {
		return err
	}
	after, err := readMigrationLog(ctx, pool, comps)
	if err != nil {
		return err
	}
	applied := newMigrations(before, after)
	return output(cmd, applied, func(t *table) {
		if len(applied) == 0 {
			t.note("nothing to apply: the schema is current")
			return
		}
		migrationRows(t, applied)
	})
}

// connectComponents connects and returns the components the command names.
func connectComponents(ctx context.Context, cmd *cli.Command) (*pgxpool.Pool, []component, error) {
	comps, err := components(cmd)
	if err != nil {
		return nil, nil, err
	}
	pool, err := connect(ctx, cmd)
	return pool, comps, err
}

func migrateList(ctx context.Context, cmd *cli.Command) error {
	pool, comps, err := connectComponents(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, _, err := migrationPlan(ctx, pool, comps)
	if err != nil {
		return err
	}
	return output(cmd, all, func(t *table) { migrationRows(t, all) })
}

func migrateValidate(ctx context.Context, cmd *cli.Command) error {
	pool, comps, err := connectComponents(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, pending, err := migrationPlan(ctx, pool, comps)
	if err != nil {
		return err
	}
	seqs, err := checkSequences(ctx, pool, comps, pending)
	if err != nil {
		return err
	}
	report := struct {
		Current   bool             `json:"current"`
		Pending   []migration      `json:"pending"`
		Sequences []sequenceReport `json:"sequences"`
	}{len(pending) == 0, pending, seqs}
	if err := output(cmd, report, func(t *table) {
		if len(pending) == 0 {
			t.note("schema current")
		} else {
			migrationRows(t, pending)
		}
		for _, s := range seqs {
			state := "ok"
			if s.Problem != "" {
				state = "breaks the relay's order"
			}
			t.note("outbox sequence %s: CACHE %d, last value %d, highest seq %d: %s", s.Sequence, s.Cache, s.LastValue, s.HighestSeq, state)
		}
	}); err != nil {
		return err
	}
	if len(pending) > 0 {
		return withCode(exitPending, "%d migrations pending: run idemq migrate", len(pending))
	}
	for _, s := range seqs {
		if s.Problem != "" {
			return withCode(exitFailure, "%s", s.Problem)
		}
	}
	return nil
}

// sequenceReport is the state of an outbox's seq sequence, which the
// relay needs at CACHE 1 and never below the seqs in use.
type sequenceReport struct {
	Sequence   string `json:"sequence"`
	Cache      int64  `json:"cache"`
	LastValue  int64  `json:"last_value"`
	HighestSeq int64  `json:"highest_seq"`
	Problem    string `json:"problem,omitempty"` // what is wrong and what to run
}

// checkSequences checks the sequence of each outbox among comps whose
// migrations are all applied.
func checkSequences(ctx context.Context, pool *pgxpool.Pool, comps []component, pending []migration) ([]sequenceReport, error) {
	out := []sequenceReport{}
	for _, c := range comps {
		if c.name != "outbox" || slices.ContainsFunc(pending, func(m migration) bool { return m.Component == c.name && m.Table == c.table }) {
			continue
		}
		ob, err := outbox.New(pool, outbox.Config{Schema: c.schema, Table: c.table})
		if err != nil {
			return nil, usageError("%w", err)
		}
		s, err := ob.CheckSequence(ctx)
		if err != nil {
			return nil, err
		}
		r := sequenceReport{Sequence: s.Sequence, Cache: s.Cache, LastValue: s.LastValue, HighestSeq: s.HighestSeq}
		if err := s.Err(); err != nil {
			r.Problem = err.Error()
		}
		out = append(out, r)
	}
	return out, nil
}

// migrationPlan returns every migration, applied or not, and the pending
// ones.
func migrationPlan(ctx context.Context, pool *pgxpool.Pool, comps []component) (all, pending []migration, err error) {
	applied, err := readMigrationLog(ctx, pool, comps)
	if err != nil {
		return nil, nil, err
	}
	pending = []migration{} // JSON [] rather than null
	for _, c := range comps {
		names, err := c.pending(ctx, pool)
		if err != nil {
			return nil, nil, err
		}
		for _, name := range names {
			version, _, _ := strings.Cut(name, "_")
			m := migration{Component: c.name, Schema: c.schema, Table: c.table, Name: name}
			m.Version, _ = strconv.Atoi(version)
			pending = append(pending, m)
		}
	}
	return append(applied, pending...), pending, nil
}

// pending returns the names of c's migrations not applied yet, in order.
func (c component) pending(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	store, err := c.open(pool)
	if err != nil {
		return nil, err
	}
	return store.PendingMigrations(ctx)
}

// applyMigrations migrates each component on db.
func applyMigrations(ctx context.Context, db outbox.DB, comps []component) error {
	for _, c := range comps {
		store, err := c.open(db)
		if err != nil {
			return err
		}
		if err := store.Migrate(ctx); err != nil {
			return fmt.Errorf("migrate %s: %w", c.name, err)
		}
	}
	return nil
}

// newMigrations returns the migrations in after that are not in before.
func newMigrations(before, after []migration) []migration {
	out := []migration{}
	for _, m := range after {
		if !slices.ContainsFunc(before, func(b migration) bool {
			return b.Component == m.Component && b.Schema == m.Schema && b.Table == m.Table && b.Version == m.Version
		}) {
			out = append(out, m)
		}
	}
	return out
}

// querier is what readMigrationLog needs: a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// readMigrationLog reads the applied migrations of comps, ordered by
// component and version; a schema without a log has none.
func readMigrationLog(ctx context.Context, db querier, comps []component) ([]migration, error) {
	out := []migration{}
	for _, c := range comps {
		log := pgx.Identifier{c.schema, "idemq_migrations"}.Sanitize()
		var exists bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, log).Scan(&exists); err != nil {
			return nil, fmt.Errorf("read migration log: %w", err)
		}
		if !exists {
			continue
		}
		rows, err := db.Query(ctx, `SELECT version, name, applied_at FROM `+log+` WHERE owner = $1 ORDER BY version`, c.owner())
		if err != nil {
			return nil, fmt.Errorf("read migration log: %w", err)
		}
		ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (migration, error) {
			m := migration{Component: c.name, Schema: c.schema, Table: c.table}
			var at time.Time
			err := row.Scan(&m.Version, &m.Name, &at)
			m.AppliedAt = &at
			return m, err
		})
		if err != nil {
			return nil, fmt.Errorf("read migration log: %w", err)
		}
		out = append(out, ms...)
	}
	return out, nil
}

func migrationRows(t *table, ms []migration) {
	t.header("COMPONENT", "TABLE", "VERSION", "NAME", "APPLIED")
	for _, m := range ms {
		applied := "pending"
		if m.AppliedAt != nil {
			applied = timestamp(*m.AppliedAt)
		}
		t.row(m.Component, m.Schema+"."+m.Table, fmt.Sprint(m.Version), m.Name, applied)
	}
}
