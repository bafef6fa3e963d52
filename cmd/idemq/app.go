package main

import (
	"context"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// Names of the global flags, read by the commands.
const (
	flagDatabaseURL    = "database-url"
	flagConnectTimeout = "connect-timeout"
	flagSchema         = "schema"
	flagOutboxTable    = "outbox-table"
	flagInboxTable     = "inbox-table"
	flagInboxPartition = "inbox-partitioned"
	flagInboxInterval  = "inbox-partition-interval"
	flagInboxRetention = "inbox-retention"
	flagJSON           = "json"
	flagRequestsTable  = "requests-table"
)

// globalOptions are the flags every command takes (the database, the
// table names, --json), typed: the parser writes each into its field, and
// validate checks them, with each command's other flags, before its action
// runs. The table names are checked by the stores' constructors (stores,
// registry, requestStore), which say which flag is wrong.
type globalOptions struct {
	databaseURL                                                  string
	connectTimeout                                               time.Duration
	schema, outboxTable, inboxTable, webhookTable, requestsTable string
	inboxPartitioned                                             string
	inboxInterval, inboxRetention                                time.Duration
	json                                                         bool

	layout inbox.Partitioning // inboxPartitioned, parsed by validate
}

const globalsKey = "idemq.globals"

// globals returns the global options of cmd's command line.
func globals(cmd *cli.Command) *globalOptions {
	return cmd.Root().Metadata[globalsKey].(*globalOptions)
}

// validate checks the global flags before any command touches anything.
func (g *globalOptions) validate() error {
	if g.connectTimeout < minConnectTimeout {
		return usageError("--%s %v: want at least %v", flagConnectTimeout, g.connectTimeout, minConnectTimeout)
	}
	switch g.inboxPartitioned {
	case "":
		// A plain inbox has no buckets: the interval would be ignored.
		if g.inboxInterval != 0 {
			return usageError("--%s applies to a partitioned inbox: give --%s arrival or key with it, or leave it out",
				flagInboxInterval, flagInboxPartition)
		}
		g.layout = inbox.Unpartitioned
	case "arrival":
		g.layout = inbox.PartitionByArrival
	case "key":
		g.layout = inbox.PartitionByKey
	default:
		return usageError("--%s: %q (want '', 'arrival' or 'key')", flagInboxPartition, g.inboxPartitioned)
	}
	return nil
}

// newApp returns the command tree. Flags are read from the command line,
// then from the environment variables named in their help, then take their
// defaults.
func newApp(stdout, stderr io.Writer) *cli.Command {
	g := &globalOptions{}
	app := &cli.Command{
		Name:  "idemq",
		Usage: "migrate, relay and inspect idemq's Postgres tables",
		Description: "The database comes from --database-url, IDEMQ_DATABASE_URL or DATABASE_URL,\n" +
			"else from the libpq variables PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGSSLMODE.\n\n" +
			exitCodesHelp,
		Writer:    stdout,
		ErrWriter: stderr,
		// main prints the error and picks the exit code.
		ExitErrHandler: func(context.Context, *cli.Command, error) {},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: flagDatabaseURL, Usage: "Postgres connection string (empty: the libpq PG* variables)",
				Sources: cli.EnvVars("IDEMQ_DATABASE_URL", "DATABASE_URL"), Destination: &g.databaseURL},
			&cli.DurationFlag{Name: flagConnectTimeout, Value: defaultConnectTimeout, Usage: "how long to try reaching the database",
				Sources: cli.EnvVars("IDEMQ_CONNECT_TIMEOUT"), Destination: &g.connectTimeout},
			&cli.StringFlag{Name: flagSchema, Value: "public", Usage: "schema of the idemq tables",
				Sources: cli.EnvVars("IDEMQ_SCHEMA"), Destination: &g.schema},
			&cli.StringFlag{Name: flagOutboxTable, Value: "idemq_outbox", Usage: "outbox table (dead letters in <table>_dead)",
				Sources: cli.EnvVars("IDEMQ_OUTBOX_TABLE"), Destination: &g.outboxTable},
			&cli.StringFlag{Name: flagInboxTable, Value: "idemq_inbox", Usage: "inbox table",
				Sources: cli.EnvVars("IDEMQ_INBOX_TABLE"), Destination: &g.inboxTable},
			&cli.StringFlag{Name: flagInboxPartition, Usage: "the inbox's layout: '' (a plain table), 'arrival' (partitions by arrival time) or 'key' " +
				"(by the time in UUIDv7 keys); 'idemq migrate' moves a live plain inbox into it, building what takes long without blocking writers first",
				Sources: cli.EnvVars("IDEMQ_INBOX_PARTITIONED"), Destination: &g.inboxPartitioned},
			&cli.DurationFlag{Name: flagInboxInterval, Usage: "a partitioned inbox's bucket width (default: the retention by arrival, 24h by key)",
				Sources: cli.EnvVars("IDEMQ_INBOX_PARTITION_INTERVAL"), Destination: &g.inboxInterval},
			&cli.DurationFlag{Name: flagInboxRetention, Usage: "how long inbox records are kept (default 7 days); the consumers' inbox.Config.Retention",
				Sources: cli.EnvVars("IDEMQ_INBOX_RETENTION"), Destination: &g.inboxRetention},
			&cli.StringFlag{Name: flagWebhookTable, Value: endpoints.TableDefault, Usage: "webhook endpoint table (keys in <table>_keys)",
				Sources: cli.EnvVars("IDEMQ_WEBHOOK_TABLE"), Destination: &g.webhookTable},
			&cli.StringFlag{Name: flagRequestsTable, Value: pgstore.TableDefault, Usage: "table of request/pgstore's HTTP and gRPC request records",
				Sources: cli.EnvVars("IDEMQ_REQUESTS_TABLE"), Destination: &g.requestsTable},
			&cli.BoolFlag{Name: flagJSON, Usage: "print JSON instead of tables", Sources: cli.EnvVars("IDEMQ_JSON"), Destination: &g.json},
		},
		// The global options, for globals.
		Metadata: map[string]any{globalsKey: g},
		Commands: []*cli.Command{migrateCommand(), relayCommand(), dlqCommand(), gcCommand(), statsCommand(), webhookCommand(), uiCommand(), versionCommand()},
		// --version prints what the version command does.
		Version: buildVersion().String(),
		Action:  groupAction,
	}
	markUsageErrors(app)
	return app
}

// groupAction runs a command that only groups subcommands: its help, or a
// usage error for an unknown subcommand.
func groupAction(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Present() {
		return usageError("unknown command %q; see %s --help", cmd.Args().First(), cmd.FullName())
	}
	return cli.ShowSubcommandHelp(cmd)
}

// markUsageErrors makes every flag-parsing error of cmd and its subcommands
// exit with exitUsage, and makes every command's action refuse first
// arguments it does not take and empty values (see refuseEmpty).
func markUsageErrors(cmd *cli.Command) {
	cmd.OnUsageError = func(_ context.Context, _ *cli.Command, err error, _ bool) error {
		return usageError("%w", err)
	}
	// A command without subcommands that names no arguments takes none:
	// `idemq ui extra` used to start anyway, the extra word ignored.
	noArgs := len(cmd.Commands) == 0 && cmd.ArgsUsage == ""
	if action := cmd.Action; action != nil {
		cmd.Action = func(ctx context.Context, cmd *cli.Command) error {
			if noArgs && cmd.Args().Present() {
				return usageError("%s takes no arguments, got %q", cmd.FullName(), cmd.Args().Slice())
			}
			if err := refuseEmpty(cmd); err != nil {
				return err
			}
			if err := globals(cmd).validate(); err != nil {
				return err
			}
			return action(ctx, cmd)
		}
	}
	cmd.CommandNotFound = nil
	for _, sub := range cmd.Commands {
		markUsageErrors(sub)
	}
}

// emptyMeans are the string flags whose empty value is documented and
// means something (the libpq environment, a plain inbox, no HTTP server,
// ...). Any other flag given an empty or blank value is a usage error: an
// empty --class, --key or --destination used to mean "no filter", so that
// dlq purge --class "" purged every dead letter, and an empty table or
// prefix would silently be the default.
var emptyMeans = map[string]bool{flagDatabaseURL: true, flagInboxPartition: true, "http-addr": true, "listen-url": true,
	"nats-url": true, "config": true}

// refuseEmpty refuses an empty or blank argument, and a flag of cmd or of
// its parents set, on the command line or in the environment, to an empty
// or blank value (or a list holding one), unless emptyMeans says the empty
// value is meant.
func refuseEmpty(cmd *cli.Command) error {
	for i, arg := range cmd.Args().Slice() {
		if strings.TrimSpace(arg) == "" {
			return usageError("%s: argument %d %q is empty: give a value", cmd.FullName(), i+1, arg)
		}
	}
	for _, c := range cmd.Lineage() {
		for _, fl := range c.Flags {
			name := fl.Names()[0]
			if !fl.IsSet() || emptyMeans[name] {
				continue
			}
			var values []string
			switch v := fl.Get().(type) {
			case string:
				values = []string{v}
			case []string:
				values = v
			}
			for _, v := range values {
				if strings.TrimSpace(v) == "" {
					return usageError("--%s %q: the value is empty (which is neither \"no filter\" nor the default): give one, or leave the flag out", name, v)
				}
			}
		}
	}
	return nil
}
