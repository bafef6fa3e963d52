package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/migrate"
)

// component is a set of idemq tables with its own migrations.
type component struct {
	name string // "outbox", "inbox", "webhook", "requests"
	// open builds the component's store on db, a pool or a transaction.
	open func(db migrate.DB) (migrate.Store, error)
}

// migration is one migration as the migrate commands print it, applied or
// pending.
type migration struct {
	Component string     `json:"component"`
	Schema    string     `json:"schema"`
	Table     string     `json:"table"`
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	AppliedAt *time.Time `json:"applied_at"` // nil while pending
}

// migrationViews returns ms as the commands print them.
func migrationViews(ms []migrate.Migration) []migration {
	out := []migration{} // JSON [] rather than null
	for _, m := range ms {
		v := migration{Component: m.Component, Schema: m.Schema, Table: m.Table, Version: m.Version, Name: m.Name}
		if !m.AppliedAt.IsZero() {
			v.AppliedAt = &m.AppliedAt
		}
		out = append(out, v)
	}
	return out
}

const flagComponents = "components"

func componentsFlag(defaults ...string) cli.Flag {
	return &cli.StringSliceFlag{Name: flagComponents, Value: defaults,
		Usage: "which tables: outbox, inbox, webhook, requests (request/pgstore's)", Sources: cli.EnvVars("IDEMQ_COMPONENTS")}
}

// allComponents returns every component, by name.
func allComponents(cmd *cli.Command) map[string]component {
	return map[string]component{
		"outbox": {name: "outbox", open: func(db migrate.DB) (migrate.Store, error) {
			ob, _, err := stores(cmd, db)
			return ob, err
		}},
		"inbox": {name: "inbox", open: func(db migrate.DB) (migrate.Store, error) {
			_, ib, err := stores(cmd, db)
			return ib, err
		}},
		"webhook": {name: "webhook", open: func(db migrate.DB) (migrate.Store, error) {
			return registry(cmd, db)
		}},
		"requests": {name: "requests", open: func(db migrate.DB) (migrate.Store, error) {
			return requestStore(cmd, db)
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
				return nil, usageError("--%s: unknown component %q (want outbox, inbox, webhook or requests)", flagComponents, name)
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
		Description: "Applies what is pending, in one transaction, safely from several processes at once.\n" +
			"'migrate list' shows every migration and whether it is applied; 'migrate validate' exits 4 while any is pending,\n" +
			"and 1 when the outbox's seq sequence (which it reports) has a CACHE above 1 or is below the seqs in use;\n" +
			"'migrate export DIR' writes them as numbered SQL files for golang-migrate, goose, Atlas or Flyway.",
		Flags:  append([]cli.Flag{componentsFlag("outbox", "inbox")}, fleetFlags()...),
		Action: migrateUp,
		Commands: []*cli.Command{
			{Name: "list", Usage: "list applied and pending migrations", Flags: []cli.Flag{componentsFlag("outbox", "inbox")}, Action: migrateList},
			{Name: "validate", Usage: "exit 4 while migrations are pending, 1 if the outbox's sequence breaks the relay's order",
				Flags: append([]cli.Flag{componentsFlag("outbox", "inbox")}, fleetFlags()...), Action: migrateValidate},
			{Name: "export", Usage: "write the migrations as numbered SQL files into DIR", ArgsUsage: "DIR",
				Description: "The files carry the schema and table names of the flags, and record themselves in idemq_migrations,\n" +
					"so 'migrate validate' and the relay see a database migrated from them as current. Exporting into the same\n" +
					"DIR after an upgrade adds only the new migrations, numbered after the files there. No database is needed.",
				Flags: []cli.Flag{componentsFlag("outbox", "inbox"), &cli.StringFlag{Name: "format", Value: string(migrate.GolangMigrate),
					Usage: "golang-migrate (NNNN_name.up.sql and .down.sql, also for Atlas), goose (NNNN_name.sql) or flyway (VNNNN__name.sql, UNNNN__name.sql)"}},
				Action: migrateExport},
		},
	}
}

func migrateUp(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Present() {
		return usageError("migrate: unknown subcommand %q (want list, validate or export)", cmd.Args().First())
	}
	if src, closeCatalog, err := fleetSource(ctx, cmd); err != nil || src != nil {
		if err != nil {
			return err
		}
		defer closeCatalog()
		if cmd.String(flagInboxPartition) != "" {
			return usageError("--%s with --%s: move each database's inbox with idemq migrate on that database", flagInboxPartition, flagDatabasesFrom)
		}
		return migrateFleet(ctx, cmd, src)
	}
	pool, m, err := connectMigrator(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkInboxLayout(ctx, cmd, pool); err != nil {
		return err
	}
	ib, err := partitionedInbox(cmd, pool)
	if err != nil {
		return err
	}
	if ib != nil {
		// Outside the migration's transaction: what takes long on a big
		// live table, built without blocking its writers.
		if err := ib.PrepareLivePartitioning(ctx); err != nil {
			return err
		}
	}
	applied, err := m.Migrate(ctx)
	if err != nil {
		return err
	}
	if ib != nil {
		if err := ib.EnsurePartitions(ctx); err != nil {
			return err
		}
	}
	views := migrationViews(applied)
	return output(cmd, views, func(t *table) {
		if len(views) == 0 {
			t.note("nothing to apply: the schema is current")
			return
		}
		migrationRows(t, views)
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

// connectMigrator connects and returns the Migrator of the components the
// command names.
func connectMigrator(ctx context.Context, cmd *cli.Command) (*pgxpool.Pool, *migrate.Migrator, error) {
	pool, comps, err := connectComponents(ctx, cmd)
	if err != nil {
		return nil, nil, err
	}
	m, err := migrator(pool, comps)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, m, nil
}

// migrator returns the Migrator of comps' stores on db.
func migrator(db migrate.DB, comps []component) (*migrate.Migrator, error) {
	var stores []migrate.Store
	for _, c := range comps {
		s, err := c.open(db)
		if err != nil {
			return nil, err
		}
		stores = append(stores, s)
	}
	return migrate.New(db, stores...), nil
}

func migrateList(ctx context.Context, cmd *cli.Command) error {
	pool, m, err := connectMigrator(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := m.List(ctx)
	if err != nil {
		return err
	}
	views := migrationViews(all)
	return output(cmd, views, func(t *table) { migrationRows(t, views) })
}

func migrateValidate(ctx context.Context, cmd *cli.Command) error {
	if src, closeCatalog, err := fleetSource(ctx, cmd); err != nil || src != nil {
		if err != nil {
			return err
		}
		defer closeCatalog()
		return validateFleet(ctx, cmd, src)
	}
	pool, m, err := connectMigrator(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	ms, err := m.Pending(ctx)
	if err != nil {
		return err
	}
	pending := migrationViews(ms)
	seqs, err := checkSequences(ctx, cmd, pool, pending)
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

// checkSequences checks the outbox's seq sequence when the command names
// the outbox and its migrations are all applied.
func checkSequences(ctx context.Context, cmd *cli.Command, pool *pgxpool.Pool, pending []migration) ([]sequenceReport, error) {
	out := []sequenceReport{}
	comps, err := components(cmd)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(comps, func(c component) bool { return c.name == "outbox" }) ||
		slices.ContainsFunc(pending, func(m migration) bool { return m.Component == "outbox" }) {
		return out, nil
	}
	ob, _, err := stores(cmd, pool)
	if err != nil {
		return nil, err
	}
	s, err := ob.CheckSequence(ctx)
	if err != nil {
		return nil, err
	}
	r := sequenceReport{Sequence: s.Sequence, Cache: s.Cache, LastValue: s.LastValue, HighestSeq: s.HighestSeq}
	if err := s.Err(); err != nil {
		r.Problem = err.Error()
	}
	return append(out, r), nil
}

func migrateExport(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() != 1 {
		return usageError("migrate export: want one argument, the directory to write into")
	}
	comps, err := components(cmd)
	if err != nil {
		return err
	}
	// The stores want a handle, which Export never uses: a pool connects
	// only when used, so export works without a database.
	pool, err := pgxpool.New(ctx, globals(cmd).databaseURL)
	if err != nil {
		return usageError("--%s: %v", flagDatabaseURL, err)
	}
	defer pool.Close()
	m, err := migrator(pool, comps)
	if err != nil {
		return err
	}
	files, err := m.Export(cmd.Args().First(), migrate.Format(cmd.String("format")))
	if err != nil {
		return configError(err)
	}
	return output(cmd, files, func(t *table) {
		if len(files) == 0 {
			t.note("nothing to export: %s holds every migration", cmd.Args().First())
		}
		for _, f := range files {
			t.row(f)
		}
	})
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

// partitionedInbox returns the inbox when the command migrates it and
// --inbox-partitioned asks for a partitioned layout, nil otherwise.
func partitionedInbox(cmd *cli.Command, pool *pgxpool.Pool) (*inbox.Store, error) {
	comps, err := components(cmd)
	if err != nil || globals(cmd).inboxPartitioned == "" || !slices.ContainsFunc(comps, func(c component) bool { return c.name == "inbox" }) {
		return nil, err
	}
	_, ib, err := stores(cmd, pool)
	return ib, err
}

// checkInboxLayout refuses to migrate, before anything is applied, a
// partitioned inbox table as a plain one: the plain migrations are all
// applied there, so migrate used to say "nothing to apply" while the
// flags described another layout than the table's, and the consumers
// configured like the flags failed on every claim. (Which partitioned
// layout, arrival or key, and its interval are not recorded in the table:
// they must match the consumers' inbox.Config.)
func checkInboxLayout(ctx context.Context, cmd *cli.Command, pool *pgxpool.Pool) error {
	comps, err := components(cmd)
	if err != nil || globals(cmd).inboxPartitioned != "" || !slices.ContainsFunc(comps, func(c component) bool { return c.name == "inbox" }) {
		return err
	}
	_, ib, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	c := ib.Config()
	table := pgx.Identifier{c.Schema, c.Table}.Sanitize()
	var partitioned bool
	if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false)`, table).Scan(&partitioned); err != nil {
		return err
	}
	if partitioned {
		return usageError("inbox table %s is partitioned, and --%s is not given: nothing was applied; give --%s arrival or key "+
			"(and --%s) as the consumers' inbox.Config has them", table, flagInboxPartition, flagInboxPartition, flagInboxInterval)
	}
	return nil
}
