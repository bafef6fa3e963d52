package migrate

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/internal/pgutil"
)

// DB is what a [Migrator] needs from a database handle: a *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it. On a pgx.Tx the migrations run
// inside it (under a savepoint) and commit with it.
type DB = pgutil.DB

// LogTable is the table in each schema that records the applied
// migrations, one row per store and version. No store may take its name.
const LogTable = pgutil.MigrationLog

// Store is a store with tables in Postgres: *inbox.Store, *outbox.Outbox,
// *endpoints.Registry and *pgstore.Store satisfy it. The Migrator reads only
// the Source; the store's own database handle is not used.
type Store interface {
	// MigrationSource returns the store's migrations and the names of its
	// tables.
	MigrationSource() Source
}

// Source is one store's migrations, as a store describes them.
//
// Files holds, in Dir, the pairs NNNN_name.up.sql and NNNN_name.down.sql
// (lower case name); versions start at 1 and every up has its down. The
// SQL may use {{schema}} and {{table}}, replaced by the quoted schema and
// the quoted table name with the rest of the placeholder as a suffix:
// {{table}} is "t" and {{table_scopes}} is "t_scopes". A suffix ending in
// "_idx" names the index Postgres chose for CREATE INDEX ON {{table}}
// without a name: {{table_key_seq_idx}} is "t_key_seq_idx", shortened the
// way Postgres shortens it when the table's name is long.
type Source struct {
	// Component names the store in the migration log: "inbox", "outbox",
	// "webhook".
	Component string
	// Schema and Table name the store's main table, as its Config does.
	Schema, Table string
	// Files and Dir hold the migration files.
	Files fs.FS
	Dir   string
}

// Migration is one migration of one store, applied or pending.
type Migration struct {
	// Component, Schema and Table say whose migration it is (see [Source]).
	Component, Schema, Table string
	// Version numbers the store's migrations from 1.
	Version int
	// Name is the file's name between the number and ".up.sql":
	// "failures" for 0002_failures.up.sql.
	Name string
	// AppliedAt is when the migration was applied; zero while pending.
	AppliedAt time.Time
	// Up and Down are the SQL with the names filled in. Both are empty for a
	// migration the log holds but the store does not know (a newer version
	// of idemq applied it).
	Up, Down string
}

// ID is the migration's name with its number, as in the file names and
// PendingMigrations: "0002_failures".
func (m Migration) ID() string { return fmt.Sprintf("%04d_%s", m.Version, m.Name) }

// ErrPending is matched by the error [Migrator.Validate] returns while
// migrations are pending; the concrete error is a [*PendingError].
var ErrPending = errors.New("idemq: migrations pending")

// PendingError lists the migrations [Migrator.Migrate] would apply.
type PendingError struct {
	Pending []Migration
}

func (e *PendingError) Error() string {
	ids := make([]string, len(e.Pending))
	for i, m := range e.Pending {
		ids[i] = m.Component + " " + m.Schema + "." + m.Table + " " + m.ID()
	}
	return fmt.Sprintf("idemq: %d migrations pending (%s): run idemq migrate, or migrate.Migrator.Migrate", len(e.Pending), strings.Join(ids, ", "))
}

// Is reports ErrPending.
func (e *PendingError) Is(target error) bool { return target == ErrPending }

// Migrator applies, lists, validates, undoes and exports the migrations of
// the stores it was given. It is safe for concurrent use, and any number
// of Migrators, in any number of processes, may run at once: every idemq
// migration takes one transaction-scoped advisory lock first, so one
// applies and the others wait and find nothing left to do.
type Migrator struct {
	db     DB
	stores []store
	err    error // from New: every method returns it
}

// store is a Source read and validated.
type store struct {
	component string
	table     pgutil.Table
	steps     []step // by version, from 1
}

// owner is the store's key in the migration log.
func (s store) owner() string { return s.component + ":" + s.table.Schema + "." + s.table.Name }

// log is the quoted name of the store's migration log.
func (s store) log() string { return pgx.Identifier{s.table.Schema, LogTable}.Sanitize() }

// step is one migration file pair, placeholders not yet filled in.
type step struct {
	version  int
	name     string
	up, down string
}

// New returns a Migrator of stores' migrations, run on db; stores are
// migrated in the order given and undone in the reverse order. A store
// named twice (or an inbox and a request store on one table) is one store.
// New touches no database. An invalid Source makes every method return
// the error: invalid names, or no store at all, match idemq.ErrConfig;
// misnamed files and a version without its up or its down say which. A
// nil store (a typed nil included) matches idemq.ErrConfig too, and so
// does a nil db in every method but Export, which needs no database.
func New(db DB, stores ...Store) *Migrator {
	m := &Migrator{db: db}
	if len(stores) == 0 {
		m.err = idemq.NewConfigError("migrate", "stores", "none given: name the stores whose tables to migrate")
	}
	for i, st := range stores {
		if nilcheck.IsNil(st) {
			m.err = idemq.NewConfigError("migrate", fmt.Sprintf("stores[%d]", i), "is nil: pass the store value itself")
			break
		}
		s, err := read(st.MigrationSource())
		if err != nil {
			m.err = err
			break
		}
		if !slices.ContainsFunc(m.stores, func(o store) bool { return o.owner() == s.owner() }) {
			m.stores = append(m.stores, s)
		}
	}
	return m
}

// componentPattern is what a component may be: it goes into the log's
// owner and into exported SQL as a literal.
var componentPattern = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// filePattern is a migration file's name.
var filePattern = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// read validates src and reads its files.
func read(src Source) (store, error) {
	t, err := pgutil.NewTable(src.Schema, src.Table)
	if err != nil {
		return store{}, idemq.NewConfigError("migrate", "Source", "%v", err)
	}
	if !componentPattern.MatchString(src.Component) {
		return store{}, idemq.NewConfigError("migrate", "Source.Component", "%q: want lower case letters, digits and underscores", src.Component)
	}
	entries, err := fs.ReadDir(src.Files, src.Dir)
	if err != nil {
		return store{}, fmt.Errorf("idemq: read migrations of %s: %w", src.Component, err)
	}
	s := store{component: src.Component, table: t}
	for _, e := range entries {
		parts := filePattern.FindStringSubmatch(e.Name())
		if parts == nil {
			return store{}, fmt.Errorf("idemq: migration file %q of %s is not named NNNN_name.up.sql or NNNN_name.down.sql", e.Name(), src.Component)
		}
		version, _ := strconv.Atoi(parts[1])
		body, err := fs.ReadFile(src.Files, path.Join(src.Dir, e.Name()))
		if err != nil {
			return store{}, fmt.Errorf("idemq: read migrations of %s: %w", src.Component, err)
		}
		for len(s.steps) < version {
			s.steps = append(s.steps, step{version: len(s.steps) + 1})
		}
		st := &s.steps[version-1]
		if st.name != "" && st.name != parts[2] {
			return store{}, fmt.Errorf("idemq: migration %04d of %s has two names, %q and %q", version, src.Component, st.name, parts[2])
		}
		st.name = parts[2]
		if parts[3] == "up" {
			st.up = string(body)
		} else {
			st.down = string(body)
		}
	}
	for _, st := range s.steps {
		if st.up == "" || st.down == "" {
			return store{}, fmt.Errorf("idemq: migration %04d of %s lacks its up or its down file: every version needs both", st.version, src.Component)
		}
	}
	return s, nil
}

// migration returns the step of s as a Migration with its names filled in.
func (s store) migration(st step) Migration {
	return Migration{Component: s.component, Schema: s.table.Schema, Table: s.table.Name, Version: st.version, Name: st.name,
		Up: expand(st.up, s.table), Down: expand(st.down, s.table)}
}

// Migrate applies every pending migration of every store, in one
// transaction, and returns them in the order applied, AppliedAt set. It
// creates the schemas and the migration logs it needs.
func (m *Migrator) Migrate(ctx context.Context) ([]Migration, error) {
	applied := []Migration{}
	err := m.inTx(ctx, func(tx pgx.Tx) error {
		for _, s := range m.stores {
			for _, stmt := range s.prologue() {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("idemq: prepare migrations of %s: %w", s.owner(), err)
				}
			}
			current, err := appliedVersion(ctx, tx, s)
			if err != nil {
				return err
			}
			for _, st := range s.steps[min(current, len(s.steps)):] {
				mg := s.migration(st)
				if _, err := tx.Exec(ctx, mg.Up); err != nil {
					return fmt.Errorf("idemq: migration %s %s: %w", s.owner(), mg.ID(), err)
				}
				if err := tx.QueryRow(ctx, s.record(), s.owner(), st.version, st.name).Scan(&mg.AppliedAt); err != nil {
					return fmt.Errorf("idemq: record migration %s %s: %w", s.owner(), mg.ID(), err)
				}
				applied = append(applied, mg)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// Down undoes the migrations above version to of every store, newest
// first and the stores in reverse order, in one transaction, and returns
// them in the order undone. To 0 drops every table of the stores (their
// schemas and migration logs stay). A store at or below to is left alone.
func (m *Migrator) Down(ctx context.Context, to int) ([]Migration, error) {
	if to < 0 {
		return nil, idemq.NewConfigError("migrate", "to", "%d is negative: 0 undoes every migration", to)
	}
	undone := []Migration{}
	err := m.inTx(ctx, func(tx pgx.Tx) error {
		for _, s := range slices.Backward(m.stores) {
			current, err := appliedVersion(ctx, tx, s)
			if err != nil {
				return err
			}
			if current > len(s.steps) {
				return fmt.Errorf("idemq: %s is at version %d, which this version of idemq does not know: undo it with the idemq that applied it", s.owner(), current)
			}
			for v := current; v > to; v-- {
				mg := s.migration(s.steps[v-1])
				if _, err := tx.Exec(ctx, mg.Down); err != nil {
					return fmt.Errorf("idemq: undo migration %s %s: %w", s.owner(), mg.ID(), err)
				}
				if _, err := tx.Exec(ctx, s.unrecord(), s.owner(), v); err != nil {
					return fmt.Errorf("idemq: record undoing %s %s: %w", s.owner(), mg.ID(), err)
				}
				undone = append(undone, mg)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return undone, nil
}

// withDB reports the error of New, or a nil db (a typed nil included):
// every method but Export needs the database.
func (m *Migrator) withDB() error {
	if m.err != nil {
		return m.err
	}
	if nilcheck.IsNil(m.db) {
		return idemq.NewConfigError("migrate", "db", "is nil: pass a pool or a connection (only Export works without one)")
	}
	return nil
}

// inTx runs f in a transaction that holds the migration lock.
func (m *Migrator) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	if err := m.withDB(); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, m.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockSQL); err != nil {
			return fmt.Errorf("idemq: migration lock: %w", err)
		}
		return f(tx)
	})
}

// Pending returns the migrations [Migrator.Migrate] would apply, in order,
// without changing anything; none once the tables are current.
func (m *Migrator) Pending(ctx context.Context) ([]Migration, error) {
	all, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(mg Migration) bool { return !mg.AppliedAt.IsZero() }), nil
}

// Validate returns a [*PendingError] (matching [ErrPending]) while any
// migration is pending, nil when the tables are current. Migrations the
// log holds beyond those the stores know (applied by a newer idemq during
// a rolling deploy) are not an error.
func (m *Migrator) Validate(ctx context.Context) error {
	pending, err := m.Pending(ctx)
	if err != nil {
		return err
	}
	if len(pending) > 0 {
		return &PendingError{Pending: pending}
	}
	return nil
}

// List returns every migration of every store, applied or pending, store
// by store and by version, followed in each store by the applied versions
// it does not know. It changes nothing.
func (m *Migrator) List(ctx context.Context) ([]Migration, error) {
	if err := m.withDB(); err != nil {
		return nil, err
	}
	out := []Migration{}
	for _, s := range m.stores {
		applied, err := readLog(ctx, m.db, s)
		if err != nil {
			return nil, err
		}
		for _, st := range s.steps {
			mg := s.migration(st)
			if i := slices.IndexFunc(applied, func(a Migration) bool { return a.Version == st.version }); i >= 0 {
				mg.AppliedAt = applied[i].AppliedAt
			}
			out = append(out, mg)
		}
		for _, a := range applied {
			if a.Version > len(s.steps) {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// readLog returns the migrations of s recorded in its log, by version; a
// schema without a log has none.
func readLog(ctx context.Context, db DB, s store) ([]Migration, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.log()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("idemq: read migration log: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := db.Query(ctx, `SELECT version, name, applied_at FROM `+s.log()+` WHERE owner = $1 ORDER BY version`, s.owner())
	if err != nil {
		return nil, fmt.Errorf("idemq: read migration log: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Migration, error) {
		mg := Migration{Component: s.component, Schema: s.table.Schema, Table: s.table.Name}
		err := row.Scan(&mg.Version, &mg.Name, &mg.AppliedAt)
		return mg, err
	})
	if err != nil {
		return nil, fmt.Errorf("idemq: read migration log: %w", err)
	}
	return ms, nil
}

func appliedVersion(ctx context.Context, tx pgx.Tx, s store) (int, error) {
	var current int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+s.log()+` WHERE owner = $1`, s.owner()).Scan(&current); err != nil {
		return 0, fmt.Errorf("idemq: read migration log: %w", err)
	}
	return current, nil
}

// lockSQL takes the one advisory lock every idemq migration takes before
// it creates anything, the schema included, so that two processes never
// race on CREATE SCHEMA or on the log's CREATE TABLE IF NOT EXISTS.
var lockSQL = func() string {
	h := fnv.New64a()
	h.Write([]byte("idemq-migrate"))
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(h.Sum64()))
}()

// prologue creates the store's schema and its migration log.
func (s store) prologue() []string {
	return []string{
		`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{s.table.Schema}.Sanitize(),
		`CREATE TABLE IF NOT EXISTS ` + s.log() + ` (
	owner text NOT NULL, version int NOT NULL, name text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (owner, version))`,
	}
}

// record and unrecord add and remove a row of the log: $1 owner, $2
// version, $3 name.
func (s store) record() string {
	return `INSERT INTO ` + s.log() + ` (owner, version, name) VALUES ($1, $2, $3) RETURNING applied_at`
}

func (s store) unrecord() string {
	return `DELETE FROM ` + s.log() + ` WHERE owner = $1 AND version = $2`
}

// expand replaces {{schema}} and {{table…}} placeholders by quoted
// identifiers (see [Source]).
func expand(sql string, t pgutil.Table) string {
	var b strings.Builder
	for {
		start := strings.Index(sql, "{{")
		if start < 0 {
			b.WriteString(sql)
			return b.String()
		}
		end := strings.Index(sql[start:], "}}")
		if end < 0 {
			b.WriteString(sql)
			return b.String()
		}
		b.WriteString(sql[:start])
		switch name := sql[start+2 : start+end]; {
		case name == "schema":
			b.WriteString(pgx.Identifier{t.Schema}.Sanitize())
		case strings.HasPrefix(name, "table_") && strings.HasSuffix(name, "_idx"):
			columns := strings.TrimSuffix(strings.TrimPrefix(name, "table_"), "_idx")
			b.WriteString(pgx.Identifier{t.Schema, indexName(t.Name, columns)}.Sanitize())
		case strings.HasPrefix(name, "table"):
			b.WriteString(t.Ident(strings.TrimPrefix(name, "table")))
		default:
			b.WriteString(sql[start : start+end+2])
		}
		sql = sql[start+end+2:]
	}
}

// indexName is the name Postgres gives an unnamed index on table over
// columns (makeObjectName in its indexcmds.c): table_columns_idx, where
// the longer of the two parts loses its last byte until the whole fits in
// 63 bytes. Names are ASCII here, so bytes are characters.
func indexName(table, columns string) string {
	const maxName, overhead = 63, len("_") + len("_idx")
	t, c := len(table), len(columns)
	for t+c > maxName-overhead {
		if t > c {
			t--
		} else {
			c--
		}
	}
	return table[:t] + "_" + columns[:c] + "_idx"
}
