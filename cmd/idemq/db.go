package main

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/request/pgstore"
)

const (
	defaultConnectTimeout = 10 * time.Second
	// minConnectTimeout is the shortest --connect-timeout accepted: a
	// shorter one (1ns) reports every database as unreachable.
	minConnectTimeout = 100 * time.Millisecond
)

// connect opens a pool on the configured database and checks that it
// answers.
func connect(ctx context.Context, cmd *cli.Command) (*pgxpool.Pool, error) {
	pool, err := openPool(cmd)
	if err != nil {
		return nil, err
	}
	// The table flags are usage errors (2) whether or not the database
	// answers: check them before reaching it.
	if _, _, err := stores(cmd, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := registry(cmd, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := requestStore(cmd, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if err := ping(ctx, cmd, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// openPool returns a pool on the configured database without reaching it,
// so that commands can check all their flags before they touch anything.
// The connection string goes through pgx's own parser, so an empty one
// means the libpq environment (PGHOST, PGUSER, ...) and defaults.
func openPool(cmd *cli.Command) (*pgxpool.Pool, error) {
	g := globals(cmd)
	cfg, err := pgxpool.ParseConfig(g.databaseURL)
	if err != nil {
		return nil, usageError("--%s: %v", flagDatabaseURL, err)
	}
	cfg.ConnConfig.ConnectTimeout = g.connectTimeout
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, usageError("database configuration: %v", err)
	}
	return pool, nil
}

// ping checks that the pool's database answers within --connect-timeout.
func ping(ctx context.Context, cmd *cli.Command, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, globals(cmd).connectTimeout)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		cc := pool.Config().ConnConfig
		return withCode(exitUnreachable, "database %s:%d unreachable: %w", cc.Host, cc.Port, err)
	}
	return nil
}

// stores builds the outbox and inbox from the table flags on db.
func stores(cmd *cli.Command, db outbox.DB) (*outbox.Outbox, *inbox.Store, error) {
	g := globals(cmd)
	ob, err := outbox.New(db, outbox.Config{Schema: g.schema, Table: g.outboxTable})
	if err != nil {
		// New touches no database: every error is the flags' fault.
		return nil, nil, flagConfigError(err, map[string]string{"Schema": flagSchema, "Table": flagOutboxTable})
	}
	ib, err := inbox.New(db, inbox.Config{Schema: g.schema, Table: g.inboxTable,
		Retention: g.inboxRetention, Partitioning: g.layout, PartitionInterval: g.inboxInterval})
	if err != nil {
		return nil, nil, flagConfigError(err, map[string]string{"Schema": flagSchema, "Table": flagInboxTable})
	}
	return ob, ib, nil
}

// requestStore builds request/pgstore's store on db from the flags.
func requestStore(cmd *cli.Command, db pgstore.DB) (*pgstore.Store, error) {
	g := globals(cmd)
	s, err := pgstore.New(db, pgstore.Config{Schema: g.schema, Table: g.requestsTable})
	if err != nil {
		return nil, flagConfigError(err, map[string]string{"Schema": flagSchema, "Table": flagRequestsTable})
	}
	return s, nil
}

// configError turns a constructor's idemq.ErrConfig into a usage error.
func configError(err error) error {
	if errors.Is(err, idemq.ErrConfig) {
		return usageError("%w", err)
	}
	return err
}

// flagConfigError is configError naming the flag, not the Go field, of a
// value a constructor refused: flags maps the fields the command sets from
// flags to the flags' names. A Go caller leaves a field 0 for its default;
// on the command line that is leaving the flag out, which the reason then
// says.
func flagConfigError(err error, flags map[string]string) error {
	ce, ok := errors.AsType[*idemq.ConfigError](err)
	if !ok || flags[ce.Field] == "" {
		return configError(err)
	}
	flag := "--" + flags[ce.Field]
	reason := strings.TrimPrefix(ce.Reason, "idemq: ")
	reason = strings.ReplaceAll(reason, "leave it 0 for the default", "leave "+flag+" out for the default")
	return usageError("%s: %s", flag, reason)
}

// missingTable returns Postgres's message when err says a table or schema
// does not exist: the migrations did not run (or ran with other --schema
// or table flags).
func missingTable(err error) (message string, ok bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") { // undefined_table, invalid_schema_name
		return pgErr.Message, true
	}
	return "", false
}

// notMigrated turns a missing table, wherever a command met it, into an
// error that says to migrate, with exit code 4.
func notMigrated(err error) error {
	msg, ok := missingTable(err)
	if !ok || exitCode(err) != exitFailure {
		return err
	}
	return withCode(exitPending, "the idemq tables are not there (%s): run `idemq migrate` with the same --schema and table flags "+
		"(`idemq migrate --components webhook` for the webhook tables)", msg)
}
