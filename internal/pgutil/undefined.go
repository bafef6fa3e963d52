package pgutil

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Undefined reports whether err is Postgres saying that a table (42P01),
// a column (42703) or a schema (3F000) does not exist: what a store's call
// meets on a database its migrations have not reached.
func Undefined(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703" || pg.Code == "3F000")
}
