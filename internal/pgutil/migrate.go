package pgutil

import (
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Migrate applies the numbered migrations in dir of files (named
// "0001_what.sql", "0002_….sql", …) that the table has not seen yet, all in
// one transaction. Every idemq migration of every component and table
// takes the same transaction-scoped advisory lock before it creates
// anything, the schema included, so any number of processes and
// components may migrate at once: one applies, the others wait and find
// nothing left to do. Applied versions are recorded per component and
// table in <schema>.idemq_migrations.
//
// Migration files may use {{schema}} and {{table}}, replaced by the quoted
// schema and the quoted table name with the rest of the identifier as a
// suffix: {{table}} is "t", {{table_scopes}} is "t_scopes".
func Migrate(ctx context.Context, db DB, files fs.FS, dir, component string, t Table) error {
	migrations, err := readMigrations(files, dir)
	if err != nil {
		return err
	}
	owner := component + ":" + t.Schema + "." + t.Name
	log := t.migrationLog()
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLock); err != nil {
			return fmt.Errorf("idemq: migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{t.Schema}.Sanitize()); err != nil {
			return fmt.Errorf("idemq: create schema: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+log+` (
			owner text NOT NULL, version int NOT NULL, name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (owner, version))`); err != nil {
			return fmt.Errorf("idemq: create migration log: %w", err)
		}
		current, err := appliedVersion(ctx, tx, log, owner)
		if err != nil {
			return err
		}
		for _, m := range migrations {
			if m.version <= current {
				continue
			}
			if _, err := tx.Exec(ctx, expand(m.sql, t)); err != nil {
				return fmt.Errorf("idemq: migration %s %s: %w", owner, m.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+log+` (owner, version, name) VALUES ($1, $2, $3)`, owner, m.version, m.name); err != nil {
				return fmt.Errorf("idemq: record migration %s: %w", m.name, err)
			}
		}
		return nil
	})
}

// Pending returns the names of the migrations Migrate would apply to the
// table, in order, without changing anything.
func Pending(ctx context.Context, db DB, files fs.FS, dir, component string, t Table) ([]string, error) {
	migrations, err := readMigrations(files, dir)
	if err != nil {
		return nil, err
	}
	log := t.migrationLog()
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, log).Scan(&exists); err != nil {
		return nil, fmt.Errorf("idemq: read migration log: %w", err)
	}
	current := 0
	if exists {
		if current, err = appliedVersion(ctx, db, log, component+":"+t.Schema+"."+t.Name); err != nil {
			return nil, err
		}
	}
	var names []string
	for _, m := range migrations {
		if m.version > current {
			names = append(names, m.name)
		}
	}
	return names, nil
}

func appliedVersion(ctx context.Context, db DB, log, owner string) (int, error) {
	var current int
	if err := db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+log+` WHERE owner = $1`, owner).Scan(&current); err != nil {
		return 0, fmt.Errorf("idemq: read migration log: %w", err)
	}
	return current, nil
}

// MigrationLog is the name of the table in each schema that records the
// applied migrations; no store may use it.
const MigrationLog = "idemq_migrations"

func (t Table) migrationLog() string { return pgx.Identifier{t.Schema, MigrationLog}.Sanitize() }

// migrationLock is the key of the one advisory lock all idemq migrations
// take.
var migrationLock = func() int64 {
	h := fnv.New64a()
	h.Write([]byte("idemq-migrate"))
	return int64(h.Sum64())
}()

type migration struct {
	version int
	name    string
	sql     string
}

func readMigrations(files fs.FS, dir string) ([]migration, error) {
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, fmt.Errorf("idemq: read migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		number, _, ok := strings.Cut(e.Name(), "_")
		version, err := strconv.Atoi(number)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("idemq: migration file %q is not named NNNN_name.sql", e.Name())
		}
		body, err := fs.ReadFile(files, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: version, name: e.Name(), sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// expand replaces {{schema}} and {{table…}} placeholders by quoted identifiers.
func expand(sql string, t Table) string {
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
		case strings.HasPrefix(name, "table"):
			b.WriteString(t.Ident(strings.TrimPrefix(name, "table")))
		default:
			b.WriteString(sql[start : start+end+2])
		}
		sql = sql[start+end+2:]
	}
}
