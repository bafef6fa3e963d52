package main

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
)

const defaultConnectTimeout = 10 * time.Second

// connect opens a pool on the configured database and checks that it
// answers. The connection string goes through pgx's own parser, so an empty
// one means the libpq environment (PGHOST, PGUSER, ...) and defaults.
func connect(ctx context.Context, cmd *cli.Command) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(cmd.String(flagDatabaseURL))
	if err != nil {
		return nil, usageError("--%s: %v", flagDatabaseURL, err)
	}
	timeout := cmd.Duration(flagConnectTimeout)
	if timeout <= 0 {
		return nil, usageError("--%s must be positive, got %v", flagConnectTimeout, timeout)
	}
	cfg.ConnConfig.ConnectTimeout = timeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, usageError("database configuration: %v", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, withCode(exitUnreachable, "database %s:%d unreachable: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// stores builds the outbox and inbox from the table flags on db.
func stores(cmd *cli.Command, db outbox.DB) (*outbox.Outbox, *inbox.Store, error) {
	ob, err := outbox.New(db, outbox.Config{Schema: cmd.String(flagSchema), Table: cmd.String(flagOutboxTable)})
	if err != nil {
		// New touches no database: every error is the flags' fault.
		return nil, nil, usageError("%w", err)
	}
	ib, err := inbox.New(db, inbox.Config{Schema: cmd.String(flagSchema), Table: cmd.String(flagInboxTable)})
	if err != nil {
		return nil, nil, usageError("%w", err)
	}
	return ob, ib, nil
}

// configError turns a constructor's idemq.ErrConfig into a usage error.
func configError(err error) error {
	if errors.Is(err, idemq.ErrConfig) {
		return usageError("%w", err)
	}
	return err
}
