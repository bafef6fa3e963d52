// Package pgutil holds the small Postgres helpers that the stores share:
// validated, quoted identifiers and the smallest database interface the
// stores accept. The migrations run in package migrate.
package pgutil

import (
	"context"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the stores need from a database handle: a *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// identPattern accepts the unquoted-identifier subset that needs no case
// folding surprises: lower case letters, digits and underscores, starting
// with a letter or underscore, at most 48 bytes so that derived names
// (table + "_scopes", index names) stay within Postgres' 63.
var identPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// Table is a schema-qualified table name whose parts were validated.
type Table struct {
	Schema string
	Name   string
}

// NewTable validates schema and name and returns the table. Names must match
// ^[a-z_][a-z0-9_]*$ and be at most 48 bytes, and the table may not be
// the migration log ([MigrationLog]).
func NewTable(schema, name string) (Table, error) {
	for _, part := range []struct{ what, v string }{{"schema", schema}, {"table", name}} {
		if !identPattern.MatchString(part.v) {
			return Table{}, fmt.Errorf("idemq: invalid %s name %q: want lower case letters, digits and underscores, at most 48 bytes, not starting with a digit", part.what, part.v)
		}
	}
	if name == MigrationLog {
		return Table{}, fmt.Errorf("idemq: invalid table name %q: idemq records its migrations in that table", name)
	}
	return Table{Schema: schema, Name: name}, nil
}

// MigrationLog is the name of the table in each schema that records the
// applied migrations (package migrate owns it); no store may use it.
const MigrationLog = "idemq_migrations"

// Ident returns the quoted, schema-qualified name with suffix appended to
// the table part ("" for the table itself).
func (t Table) Ident(suffix string) string {
	return pgx.Identifier{t.Schema, t.Name + suffix}.Sanitize()
}

// String returns the quoted, schema-qualified table name.
func (t Table) String() string { return t.Ident("") }
