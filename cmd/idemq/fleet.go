package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// The fleet flags: migrate, validate and relay over many databases.
const (
	flagDatabasesFrom  = "databases-from"
	flagConcurrency    = "concurrency"
	flagConnsPerServer = "conns-per-server"
)

// fleetFlags are the flags of a command that runs over a fleet.
func fleetFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: flagDatabasesFrom, Sources: cli.EnvVars("IDEMQ_DATABASES_FROM"),
			Usage: "run on every database of a fleet: a file of 'NAME CONNSTRING' lines, or sql:QUERY run on --database-url " +
				"(rows of name and connection string); the relay reads it again while it runs"},
		&cli.IntFlag{Name: flagConcurrency, Value: 4, Sources: cli.EnvVars("IDEMQ_CONCURRENCY"),
			Usage: "with --databases-from: databases migrated or validated at once"},
	}
}

// fleetSource returns the fleet --databases-from names and a func that
// closes the catalog's pool; nil without the flag.
func fleetSource(ctx context.Context, cmd *cli.Command) (fleet.Source, func(), error) {
	from := cmd.String(flagDatabasesFrom)
	if from == "" {
		return nil, func() {}, nil
	}
	if strings.TrimSpace(from) != from {
		return nil, nil, usageError("--%s %q: blank around the value", flagDatabasesFrom, from)
	}
	if query, ok := strings.CutPrefix(from, "sql:"); ok {
		if strings.TrimSpace(query) == "" {
			return nil, nil, usageError("--%s: sql: needs a query returning name and connection string", flagDatabasesFrom)
		}
		catalog, err := connect(ctx, cmd)
		if err != nil {
			return nil, nil, err
		}
		return fleet.Query(catalog, query), catalog.Close, nil
	}
	return fleet.File(from), func() {}, nil
}

// fleetResult is what a command did on one database of the fleet.
type fleetResult struct {
	Database string `json:"database"`
	Result   string `json:"result"`
	Error    string `json:"error,omitempty"`
	Took     string `json:"took"`
	pending  bool
}

// eachDatabase runs fn on every database of src, --concurrency at a time,
// goes on past failures, prints one row per database, and returns an
// error naming the databases that failed (exit 1), or that have
// migrations pending (exit 4) when none failed otherwise.
func eachDatabase(ctx context.Context, cmd *cli.Command, src fleet.Source, fn func(ctx context.Context, conn *pgx.Conn) (string, error)) error {
	n := cmd.Int(flagConcurrency)
	if n < 1 || n > 100 {
		return usageError("--%s %d: want 1 to 100", flagConcurrency, n)
	}
	dbs, err := src.Databases(ctx)
	if err != nil {
		return withCode(exitFailure, "%v", err)
	}
	results := make([]fleetResult, len(dbs))
	place := make(map[string]int, len(dbs)) // names are unique (fleet.Check)
	for i, d := range dbs {
		place[d.Name] = i
	}
	var failed, pending []string
	for i, r := range fleet.Each(ctx, dbs, n, func(ctx context.Context, d fleet.Database, conn *pgx.Conn) error {
		var err error
		results[place[d.Name]].Result, err = fn(ctx, conn)
		return err
	}) {
		res := &results[i]
		res.Database, res.Took = r.Database.Name, r.Took.Round(time.Millisecond).String()
		var pend *migrate.PendingError
		switch {
		case errors.As(r.Err, &pend):
			res.Result, res.pending = fmt.Sprintf("%d pending", len(pend.Pending)), true
			pending = append(pending, res.Database)
		case r.Err != nil:
			res.Result, res.Error = "failed", r.Err.Error()
			failed = append(failed, res.Database)
		}
	}
	if err := output(cmd, results, func(t *table) {
		t.header("DATABASE", "RESULT", "TOOK", "ERROR")
		for _, r := range results {
			t.row(r.Database, r.Result, r.Took, r.Error)
		}
	}); err != nil {
		return err
	}
	switch {
	case len(failed) > 0:
		return withCode(exitFailure, "%d of %d databases failed: %s", len(failed), len(dbs), strings.Join(failed, ", "))
	case len(pending) > 0:
		return withCode(exitPending, "%d of %d databases have migrations pending: %s; run idemq migrate --%s", len(pending), len(dbs), strings.Join(pending, ", "), flagDatabasesFrom)
	}
	return nil
}

// migrateFleet applies the pending migrations of the components on every
// database of src.
func migrateFleet(ctx context.Context, cmd *cli.Command, src fleet.Source) error {
	return eachMigrator(ctx, cmd, src, func(ctx context.Context, m *migrate.Migrator) (string, error) {
		applied, err := m.Migrate(ctx)
		if err != nil || len(applied) == 0 {
			return "current", err
		}
		return fmt.Sprintf("%d applied", len(applied)), nil
	})
}

// validateFleet is migrate validate on every database of src: exit 4
// while any has migrations pending.
func validateFleet(ctx context.Context, cmd *cli.Command, src fleet.Source) error {
	return eachMigrator(ctx, cmd, src, func(ctx context.Context, m *migrate.Migrator) (string, error) {
		return "current", m.Validate(ctx)
	})
}

// eachMigrator runs fn with the Migrator of the command's components on
// every database of src (see eachDatabase).
func eachMigrator(ctx context.Context, cmd *cli.Command, src fleet.Source, fn func(context.Context, *migrate.Migrator) (string, error)) error {
	comps, err := components(cmd)
	if err != nil {
		return err
	}
	return eachDatabase(ctx, cmd, src, func(ctx context.Context, conn *pgx.Conn) (string, error) {
		m, err := migrator(conn, comps)
		if err != nil {
			return "", err
		}
		return fn(ctx, m)
	})
}

// statsFleet prints each database's backlog from its outbox's gauges.
func statsFleet(ctx context.Context, cmd *cli.Command, src fleet.Source) error {
	return eachDatabase(ctx, cmd, src, func(ctx context.Context, conn *pgx.Conn) (string, error) {
		ob, _, err := stores(cmd, conn)
		if err != nil {
			return "", err
		}
		g, err := ob.Gauges(ctx)
		if err != nil {
			return "", err
		}
		var due time.Duration
		for _, d := range g.Destinations {
			due = max(due, d.OldestDue)
		}
		live := 0
		for _, r := range g.Relays {
			if r.Alive {
				live++
			}
		}
		approx := "~"
		if g.Exact {
			approx = ""
		}
		return fmt.Sprintf("backlog %s%d, oldest due %v, %d relay workers alive", approx, g.Depth, due.Round(time.Second), live), nil
	})
}

// runFleetRelay drains the outboxes of every database of src within
// --conns-per-server connections per server.
func runFleetRelay(ctx context.Context, cmd *cli.Command, o *relayOptions, src fleet.Source, ob outbox.Config) error {
	switch {
	case o.Webhooks:
		return usageError("--webhooks with --%s: each database has its own endpoint registry; run a relay per database for webhooks", flagDatabasesFrom)
	case o.migrate:
		return usageError("--migrate with --%s: migrate the fleet first with idemq migrate --%s", flagDatabasesFrom, flagDatabasesFrom)
	}
	for _, r := range o.plan.routes {
		if r.sink == "kafka-tx" {
			return usageError("--route %s with --%s: the transactional sink's ids are per outbox partition and would collide across databases", r.pattern, flagDatabasesFrom)
		}
	}
	tel, err := newTelemetry(ctx)
	if err != nil {
		return err
	}
	defer tel.shutdown() //nolint:errcheck // best effort on exit
	cfg := o.relay
	cfg.Logger, cfg.Hooks = o.logger, tel.RelayHooks(relay.Hooks{})
	router := relay.NewRouter()
	f, err := relay.NewFleet(src, router, relay.FleetConfig{Relay: cfg, Outbox: ob, ConnsPerServer: o.connsPerServer, Logger: o.logger})
	if err != nil {
		return relayConfigError(err)
	}
	s, err := buildSinks(o.plan, router, nil, tel.Telemetry)
	if err != nil {
		return err
	}
	defer s.close()
	if _, err := tel.ObserveFleet(f); err != nil {
		return err
	}
	if o.httpAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(tel.registry, promhttp.HandlerOpts{}))
		stop, err := serveHTTP(o.httpAddr, mux, o.logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	o.logger.Info("relay fleet starting", "databases_from", cmd.String(flagDatabasesFrom), "routes", o.Routes,
		"conns_per_server", o.connsPerServer, "workers", cfg.Workers, "batch_size", cfg.BatchSize)
	if err := f.Run(ctx); err != nil {
		return fmt.Errorf("relay fleet: %w", err)
	}
	return nil
}
