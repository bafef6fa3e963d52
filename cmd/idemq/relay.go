package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// relayOptions are the relay command's settings, typed: the flag parser
// writes each flag into its field (Destination), readConfig fills in from
// the --config file what the flags leave unset, and validate checks all of
// them before the relay touches the database or a broker. relay --check is
// validate and a print, so it refuses what the relay would.
type relayOptions struct {
	sinkConfig
	configPath          string
	httpAddr            string
	migrate, check      bool
	logFormat, logLevel string
	connsPerServer      int  // with --databases-from
	maintenance         bool // run the maintenance chores beside the relay
	// relay is the relay.Config the flags set; Logger and Hooks are added
	// when it runs.
	relay relay.Config

	// Filled in by validate.
	logger *slog.Logger
	plan   sinkPlan
	comps  []component
}

func relayCommand() *cli.Command {
	o := &relayOptions{}
	c := &o.relay
	return &cli.Command{
		Name:  "relay",
		Usage: "run the outbox relay: publish outbox messages to Kafka, NATS and webhook endpoints",
		Description: "Routes map destinations to sinks: --route 'orders.*=kafka' --route 'shipping.*=jetstream:SHIPPING.in'.\n" +
			"A route is PATTERN=SINK[:TARGET]: PATTERN is a destination, or a prefix of destinations when it ends in *;\n" +
			"TARGET is the Kafka topic (kafka, franz, kafka-tx) or the NATS subject (jetstream, nats) every message the\n" +
			"route matches is published to; without :TARGET the message's destination is its topic or subject.\n" +
			"Kafka sinks: kafka (kafka-go, the default), franz (franz-go, idempotent producer), kafka-tx (franz-go, one Kafka\n" +
			"transaction per outbox partition and batch, fenced by the relay's leases: exactly once for read_committed consumers;\n" +
			"kafka-tx routes need --kafka-tx-id-prefix and --kafka-watermark-topic, both unique to the outbox).\n" +
			"SIGTERM or Ctrl-C stops claiming; batches in flight get --shutdown-grace to finish, the rest is released, not lost.\n" +
			"--http-addr serves /metrics (Prometheus), /healthz (the relay loop is running) and /readyz\n" +
			"(database reachable, schema current, relay claiming).\n" +
			"Each message sent gets a span whose traceparent goes on in its headers; with OTEL_EXPORTER_OTLP_ENDPOINT set,\n" +
			"metrics and spans are also exported over OTLP/HTTP.\n" +
			"It exits 4 when migrations are pending, unless --migrate applies them first.\n" +
			"--check validates the flags, environment and --config file without contacting anything: exit 0 or 2.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "route", Usage: "PATTERN=SINK[:TARGET]; SINK is kafka, franz, kafka-tx, jetstream or nats; PATTERN may end in *; " +
				"TARGET is the topic or subject to publish to (default: the message's destination)",
				Sources: cli.EnvVars("IDEMQ_ROUTES"), Destination: &o.Routes},
			&cli.StringSliceFlag{Name: "kafka-brokers", Usage: "Kafka bootstrap brokers host:port", Sources: cli.EnvVars("IDEMQ_KAFKA_BROKERS"),
				Destination: &o.KafkaBrokers},
			&cli.StringFlag{Name: "kafka-tx-id-prefix", Usage: "kafka-tx routes (required with them): transactional.id prefix (+ outbox partition), unique to this outbox " +
				"(earlier versions defaulted to " + kafkaTxIDPrefixBefore + ")",
				Sources: cli.EnvVars("IDEMQ_KAFKA_TX_ID_PREFIX"), Destination: &o.KafkaTxIDPrefix},
			&cli.StringFlag{Name: "kafka-watermark-topic", Usage: "kafka-tx routes (required with them): compacted topic of the watermarks (created if missing), " +
				"unique to this outbox (earlier versions defaulted to " + kafkaWatermarkTopicBefore + ")",
				Sources: cli.EnvVars("IDEMQ_KAFKA_WATERMARK_TOPIC"), Destination: &o.KafkaWatermarkTopic},
			&cli.StringFlag{Name: "nats-url", Usage: "NATS server URL", Sources: cli.EnvVars("IDEMQ_NATS_URL", "NATS_URL"), Destination: &o.NATSURL},
			&cli.BoolFlag{Name: "webhooks", Usage: "deliver webhook/<endpoint> destinations to the registered webhook endpoints",
				Sources: cli.EnvVars("IDEMQ_WEBHOOKS"), Destination: &o.Webhooks},
			&cli.StringSliceFlag{Name: "webhook-allow-network", Usage: "CIDR the webhook SSRF guard lets through (repeatable)",
				Sources: cli.EnvVars("IDEMQ_WEBHOOK_ALLOW_NETWORKS"), Destination: &o.WebhookAllowNetworks},
			&cli.StringFlag{Name: "config", Usage: "JSON file with routes, kafka_brokers, kafka_tx_id_prefix, kafka_watermark_topic, nats_url, webhooks and webhook_allow_networks, for what the flags leave unset",
				Sources: cli.EnvVars("IDEMQ_CONFIG"), Destination: &o.configPath},
			&cli.StringFlag{Name: "http-addr", Usage: "address for /metrics, /healthz and /readyz (empty: none)",
				Sources: cli.EnvVars("IDEMQ_HTTP_ADDR"), Destination: &o.httpAddr},
			&cli.BoolFlag{Name: "migrate", Usage: "apply pending migrations before starting", Sources: cli.EnvVars("IDEMQ_MIGRATE"), Destination: &o.migrate},
			&cli.BoolFlag{Name: "check", Usage: "check the flags, environment and --config file, print the relay's settings and exit (0 valid, 2 not); contacts no database or broker",
				Destination: &o.check},
			&cli.IntFlag{Name: "workers", Usage: fmt.Sprintf("batches in flight at once (at most %d)", relay.WorkersMax), Value: relay.WorkersDefault,
				Sources: cli.EnvVars("IDEMQ_RELAY_WORKERS"), Destination: &c.Workers},
			&cli.IntFlag{Name: "batch-size", Usage: fmt.Sprintf("rows per claim (at most %d)", relay.BatchSizeMax), Value: relay.BatchSizeDefault,
				Sources: cli.EnvVars("IDEMQ_RELAY_BATCH_SIZE"), Destination: &c.BatchSize},
			&cli.IntFlag{Name: "max-attempts", Usage: "failed publishes before a dead letter (no maximum: it is only compared)", Value: relay.RetryDefault.MaxAttempts,
				Sources: cli.EnvVars("IDEMQ_RELAY_MAX_ATTEMPTS"), Destination: &c.Retry.MaxAttempts},
			&cli.DurationFlag{Name: "poll-interval", Value: relay.PollIntervalDefault, Usage: fmt.Sprintf("how often an idle relay looks for rows without a NOTIFY (at least %v)", relay.PollIntervalMin),
				Sources: cli.EnvVars("IDEMQ_RELAY_POLL_INTERVAL"), Destination: &c.PollInterval},
			&cli.DurationFlag{Name: "lease-ttl", Value: relay.LeaseTTLDefault, Usage: fmt.Sprintf("how long a dead relay's key partitions wait before other relays take them over "+
				"(%v to %v); a relay stalled in the middle of a batch holds them up to --publish-timeout + --lease-ttl/3 (%v on the defaults)",
				relay.LeaseTTLMin, relay.LeaseTTLMax, (relay.PublishTimeoutDefault + relay.LeaseTTLDefault/3).Round(time.Second)),
				Sources: cli.EnvVars("IDEMQ_RELAY_LEASE_TTL"), Destination: &c.LeaseTTL},
			&cli.DurationFlag{Name: "publish-timeout", Value: relay.PublishTimeoutDefault, Usage: fmt.Sprintf("how long one batch's publish may take before its rows go back for a retry (%v to %v)",
				relay.PublishTimeoutMin, relay.PublishTimeoutMax),
				Sources: cli.EnvVars("IDEMQ_RELAY_PUBLISH_TIMEOUT"), Destination: &c.PublishTimeout},
			&cli.DurationFlag{Name: "shutdown-grace", Value: relay.ShutdownGraceDefault, Usage: "time in-flight batches get after SIGTERM",
				Sources: cli.EnvVars("IDEMQ_SHUTDOWN_GRACE"), Destination: &c.ShutdownGrace},
			&cli.DurationFlag{Name: "stats-interval", Value: relay.StatsIntervalDefault, Usage: fmt.Sprintf("how often the backlog gauges refresh (at least %v)", relay.StatsIntervalMin),
				Sources: cli.EnvVars("IDEMQ_RELAY_STATS_INTERVAL"), Destination: &c.StatsInterval},
			&cli.BoolFlag{Name: "park-followers", Usage: "hold a key's later messages while an earlier one is a dead letter",
				Sources: cli.EnvVars("IDEMQ_RELAY_PARK_FOLLOWERS"), Destination: &c.ParkFollowers},
			&cli.StringFlag{Name: "listen-url", Usage: "direct Postgres connection for LISTEN when --database-url goes through a transaction-mode pooler such as PgBouncer (empty: the database URL)",
				Sources: cli.EnvVars("IDEMQ_LISTEN_URL"), Destination: &c.ListenConnString},
			&cli.BoolFlag{Name: "poll-only", Usage: "do not LISTEN: find new messages by polling every --poll-interval",
				Sources: cli.EnvVars("IDEMQ_RELAY_POLL_ONLY"), Destination: &c.DisableListen},
			&cli.DurationFlag{Name: "stall-threshold", Value: relay.StallThresholdDefault, Usage: "log a stall when a message free to go has been due this long",
				Sources: cli.EnvVars("IDEMQ_RELAY_STALL_THRESHOLD"), Destination: &c.StallThreshold},
			&cli.StringFlag{Name: "log-format", Value: "json", Usage: "log format on stderr: json or text", Sources: cli.EnvVars("IDEMQ_LOG_FORMAT"), Destination: &o.logFormat},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "least level logged: debug, info, warn or error", Sources: cli.EnvVars("IDEMQ_LOG_LEVEL"), Destination: &o.logLevel},
			componentsFlag("outbox"),
			&cli.BoolFlag{Name: "maintenance", Value: true, Sources: cli.EnvVars("IDEMQ_MAINTENANCE"), Destination: &o.maintenance,
				Usage: "run the maintenance chores beside the relay, one process at a time however many relays run: outbox dead-letter " +
					"classes, and, where their tables exist, inbox GC and partitions and request-record GC (--maintenance=false: schedule idemq gc yourself)"},
			fleetFlags()[0],
			&cli.IntFlag{Name: flagConnsPerServer, Value: relay.ConnsPerServerDefault, Sources: cli.EnvVars("IDEMQ_CONNS_PER_SERVER"),
				Usage: fmt.Sprintf("with --%s: the most connections the relay holds on one Postgres server, all its databases together "+
					"(each database drained holds --workers + 3)", flagDatabasesFrom), Destination: &o.connsPerServer},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error { return runRelay(ctx, cmd, o) },
	}
}

// validate checks every setting, in the order a person reads them, before
// the relay touches the database or a broker: a typo must not migrate
// anything, and is a usage error (2) whether or not the database answers.
// The relay.Config fields are checked by relay.New itself (it contacts
// nothing), so their limits are the library's.
func (o *relayOptions) validate(cmd *cli.Command, pool *pgxpool.Pool, ob *outbox.Outbox) (err error) {
	if o.logger, err = newLogger(cmd.Root().ErrWriter, o.logFormat, o.logLevel); err != nil {
		return err
	}
	if err := o.readConfig(cmd); err != nil {
		return err
	}
	if o.plan, err = o.sinkConfig.plan(); err != nil {
		return err
	}
	// relay.Config takes zero for its default, so --shutdown-grace 0 would
	// silently be 10 seconds and --max-attempts 0 ten attempts; the flags'
	// defaults are positive, so zero or less was given.
	c := o.relay
	for name, n := range map[string]int{"workers": c.Workers, "batch-size": c.BatchSize, "max-attempts": c.Retry.MaxAttempts} {
		if n <= 0 {
			return usageError("--%s %d: want a positive number (leave it out for the default)", name, n)
		}
	}
	for name, d := range map[string]time.Duration{"poll-interval": c.PollInterval, "lease-ttl": c.LeaseTTL, "publish-timeout": c.PublishTimeout,
		"shutdown-grace": c.ShutdownGrace, "stats-interval": c.StatsInterval, "stall-threshold": c.StallThreshold} {
		if d <= 0 {
			return usageError("--%s %v: want a positive duration (leave it out for the default)", name, d)
		}
	}
	if _, err := relay.New(pool, ob, relay.NewRouter(), c); err != nil {
		return relayConfigError(err)
	}
	if o.httpAddr != "" {
		if _, _, err := net.SplitHostPort(o.httpAddr); err != nil {
			return usageError("--http-addr %q: %v", o.httpAddr, err)
		}
	}
	if o.comps, err = components(cmd); err != nil {
		return err
	}
	if o.Webhooks && !slices.ContainsFunc(o.comps, func(c component) bool { return c.name == "webhook" }) {
		// The webhook Sink reads the registry: its tables must be current too.
		o.comps = append(o.comps, allComponents(cmd)["webhook"])
	}
	return nil
}

// readConfig fills in, from the --config file, what the flags leave unset.
func (o *relayOptions) readConfig(cmd *cli.Command) error {
	if o.configPath == "" {
		return nil
	}
	file, err := readSinkConfig(o.configPath)
	if err != nil {
		return err
	}
	for flag, fill := range map[string]func(){
		"route":                 func() { o.Routes = file.Routes },
		"kafka-brokers":         func() { o.KafkaBrokers = file.KafkaBrokers },
		"nats-url":              func() { o.NATSURL = file.NATSURL },
		"kafka-tx-id-prefix":    func() { o.KafkaTxIDPrefix = file.KafkaTxIDPrefix },
		"kafka-watermark-topic": func() { o.KafkaWatermarkTopic = file.KafkaWatermarkTopic },
		"webhooks":              func() { o.Webhooks = file.Webhooks },
		"webhook-allow-network": func() { o.WebhookAllowNetworks = file.WebhookAllowNetworks },
	} {
		if !cmd.IsSet(flag) {
			fill()
		}
	}
	return nil
}

func runRelay(ctx context.Context, cmd *cli.Command, o *relayOptions) error {
	pool, err := openPool(cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, _, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	if err := o.validate(cmd, pool, ob); err != nil {
		return err
	}
	m, err := migrator(pool, o.comps)
	if err != nil {
		return err
	}
	reg, err := registry(cmd, pool)
	if err != nil {
		return err
	}
	if o.check {
		return o.print(cmd, pool, ob)
	}
	src, closeCatalog, err := fleetSource(ctx, cmd)
	if err != nil {
		return err
	}
	defer closeCatalog()
	if src != nil {
		return runFleetRelay(ctx, cmd, o, src, ob.Config())
	}
	tel, err := outboxTelemetry(ctx, ob)
	if err != nil {
		return err
	}
	defer tel.shutdown() //nolint:errcheck // best effort on exit
	cfg := o.relay
	cfg.Logger, cfg.Hooks = o.logger, tel.RelayHooks(relay.Hooks{})
	router := relay.NewRouter() // routed by buildSinks, before Run
	r, err := relay.New(pool, ob, router, cfg)
	if err != nil {
		return relayConfigError(err)
	}

	if err := ping(ctx, cmd, pool); err != nil {
		return err
	}
	if o.migrate {
		if _, err := m.Migrate(ctx); err != nil {
			return err
		}
	}
	var pending *migrate.PendingError
	if err := m.Validate(ctx); errors.As(err, &pending) {
		return withCode(exitPending, "%d migrations pending: run idemq migrate, or start the relay with --migrate", len(pending.Pending))
	} else if err != nil {
		return err
	}
	if o.plan.outbox, err = relay.OutboxName(ctx, pool, ob); err != nil {
		return err
	}
	s, err := buildSinks(o.plan, router, reg, tel.Telemetry)
	if err != nil {
		return err
	}
	defer s.close()

	h := &health{pool: pool, relay: r, migrator: m}
	if o.httpAddr != "" {
		stop, err := serveHTTP(o.httpAddr, h.handler(tel.registry), o.logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	if o.maintenance {
		stop, err := startMaintenance(ctx, cmd, pool, r)
		if err != nil {
			return err
		}
		defer stop()
	}
	h.running.Store(true)
	o.logger.Info("relay starting", "schema", ob.Config().Schema, "outbox", ob.Config().Table, "routes", o.Routes,
		"workers", cfg.Workers, "batch_size", cfg.BatchSize, "lease_ttl", cfg.LeaseTTL, "publish_timeout", cfg.PublishTimeout,
		"poll_interval", cfg.PollInterval)
	err = r.Run(ctx)
	h.running.Store(false)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// startMaintenance starts the relay's maintenance service with the chores
// of the stores whose tables exist on pool: the outbox's always, the
// inbox's and the request store's when they are migrated. A partitioned
// inbox then gets its partitions made ahead and dropped without a cron.
func startMaintenance(ctx context.Context, cmd *cli.Command, pool *pgxpool.Pool, r *relay.Relay) (stop func(), err error) {
	_, ib, err := stores(cmd, pool)
	if err != nil {
		return nil, err
	}
	requests, err := requestStore(cmd, pool)
	if err != nil {
		return nil, err
	}
	var extra []idemq.Chore
	if pending, err := ib.PendingMigrations(ctx); err == nil && len(pending) == 0 {
		extra = append(extra, ib.Chores()...)
	}
	if pending, err := requests.PendingMigrations(ctx); err == nil && len(pending) == 0 {
		extra = append(extra, requests.Chores()...)
	}
	m, err := r.Maintenance(extra...)
	if err != nil {
		return nil, err
	}
	running, err := idemq.Start(ctx, m)
	if err != nil {
		return nil, err
	}
	return func() { _ = running.Stop() }, nil
}

// print is relay --check's output: the settings the relay would run with.
// The OpenTelemetry setup is not built: its exporters would flush to the
// OTLP endpoint on shutdown.
func (o *relayOptions) print(cmd *cli.Command, pool *pgxpool.Pool, ob *outbox.Outbox) error {
	cc := pool.Config().ConnConfig
	c := o.relay
	settings := relayCheck{OK: true, Database: fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database), Schema: ob.Config().Schema,
		Outbox: ob.Config().Table, Routes: o.Routes, KafkaBrokers: o.KafkaBrokers, NATSURL: redactURL(o.NATSURL),
		Webhooks: o.Webhooks, WebhookAllowNetworks: o.WebhookAllowNetworks, HTTPAddr: o.httpAddr,
		Workers: c.Workers, BatchSize: c.BatchSize, MaxAttempts: c.Retry.MaxAttempts}
	if slices.ContainsFunc(o.plan.routes, func(r route) bool { return r.sink == "kafka-tx" }) {
		settings.KafkaTxIDPrefix, settings.KafkaWatermarkTopic = o.KafkaTxIDPrefix, o.KafkaWatermarkTopic
	}
	for _, d := range []struct {
		to *string
		d  time.Duration
	}{{&settings.PollInterval, c.PollInterval}, {&settings.LeaseTTL, c.LeaseTTL}, {&settings.PublishTimeout, c.PublishTimeout},
		{&settings.ShutdownGrace, c.ShutdownGrace}, {&settings.StatsInterval, c.StatsInterval}, {&settings.StallThreshold, c.StallThreshold}} {
		*d.to = d.d.String()
	}
	return output(cmd, settings, func(t *table) {
		t.note("relay configuration valid (no database or broker was contacted)")
		t.row("database", settings.Database)
		t.row("outbox", settings.Schema+"."+settings.Outbox)
		for _, r := range settings.Routes {
			t.row("route", r)
		}
		if settings.Webhooks {
			t.row("route", endpoints.DestinationPrefix+"*=webhook")
		}
		t.row("kafka brokers", strings.Join(settings.KafkaBrokers, ","))
		if settings.KafkaTxIDPrefix != "" {
			t.row("kafka tx id prefix", settings.KafkaTxIDPrefix)
			t.row("kafka watermark topic", settings.KafkaWatermarkTopic)
		}
		t.row("nats url", settings.NATSURL)
		t.row("webhook allow networks", strings.Join(settings.WebhookAllowNetworks, ","))
		t.row("http addr", settings.HTTPAddr)
		t.row("workers", strconv.Itoa(settings.Workers))
		t.row("batch size", strconv.Itoa(settings.BatchSize))
		t.row("max attempts", strconv.Itoa(settings.MaxAttempts))
		t.row("poll interval", settings.PollInterval)
		t.row("lease ttl", settings.LeaseTTL)
		t.row("publish timeout", settings.PublishTimeout)
		t.row("shutdown grace", settings.ShutdownGrace)
		t.row("stats interval", settings.StatsInterval)
		t.row("stall threshold", settings.StallThreshold)
	})
}

// relayCheck is what relay --check prints.
type relayCheck struct {
	OK                   bool     `json:"ok"`
	Database             string   `json:"database"`
	Schema               string   `json:"schema"`
	Outbox               string   `json:"outbox_table"`
	Routes               []string `json:"routes"`
	KafkaBrokers         []string `json:"kafka_brokers"`
	KafkaTxIDPrefix      string   `json:"kafka_tx_id_prefix,omitempty"`
	KafkaWatermarkTopic  string   `json:"kafka_watermark_topic,omitempty"`
	NATSURL              string   `json:"nats_url"`
	Webhooks             bool     `json:"webhooks"`
	WebhookAllowNetworks []string `json:"webhook_allow_networks"`
	HTTPAddr             string   `json:"http_addr"`
	Workers              int      `json:"workers"`
	BatchSize            int      `json:"batch_size"`
	MaxAttempts          int      `json:"max_attempts"`
	PollInterval         string   `json:"poll_interval"`
	LeaseTTL             string   `json:"lease_ttl"`
	PublishTimeout       string   `json:"publish_timeout"`
	ShutdownGrace        string   `json:"shutdown_grace"`
	StatsInterval        string   `json:"stats_interval"`
	StallThreshold       string   `json:"stall_threshold"`
}

// newLogger returns the relay's logger on w: format json or text, at
// level (debug, info, warn, error) and above. Durations print as text
// ("1.5s"), in JSON too, where slog would print nanoseconds.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Value.Kind() == slog.KindDuration {
			a.Value = slog.StringValue(a.Value.Duration().String())
		}
		return a
	}}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, usageError("--log-format %q: want json or text", format)
}

// relayFlags names the flag of each relay.Config field the relay sets.
var relayFlags = map[string]string{"Workers": "workers", "BatchSize": "batch-size", "PollInterval": "poll-interval",
	"LeaseTTL": "lease-ttl", "PublishTimeout": "publish-timeout", "ShutdownGrace": "shutdown-grace", "StatsInterval": "stats-interval",
	"Retry.MaxAttempts": "max-attempts", "StallThreshold": "stall-threshold", "ListenConnString": "listen-url"}

// relayConfigError is configError naming the flag, not the Go field, of a
// value relay.New refused.
func relayConfigError(err error) error { return flagConfigError(err, relayFlags) }

// health answers /healthz and /readyz.
type health struct {
	pool     *pgxpool.Pool
	relay    *relay.Relay
	migrator *migrate.Migrator // of the tables the relay uses
	running  atomic.Bool       // the relay's Run loop has not returned
}

func (h *health) handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		// Liveness needs no database: a restart would not fix an outage.
		check(w, map[string]error{"relay_loop": h.loop()})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		checks := map[string]error{"relay_loop": h.loop(), "database": h.pool.Ping(ctx), "schema": h.schemaCurrent(ctx)}
		select {
		case <-h.relay.Ready():
			checks["claiming"] = nil
		default:
			checks["claiming"] = errors.New("the relay is not claiming yet")
		}
		check(w, checks)
	})
	return mux
}

func (h *health) loop() error {
	if !h.running.Load() {
		return errors.New("the relay loop is not running")
	}
	return nil
}

// schemaCurrent reports whether the tables are still current, as they were
// at start: a dropped or downgraded schema makes the relay unready.
func (h *health) schemaCurrent(ctx context.Context) error { return h.migrator.Validate(ctx) }

// check writes the checks as JSON: 200 when all passed, 503 otherwise.
func check(w http.ResponseWriter, checks map[string]error) {
	status, body := http.StatusOK, map[string]string{}
	for name, err := range checks {
		body[name] = "ok"
		if err != nil {
			status, body[name] = http.StatusServiceUnavailable, err.Error()
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body) //nolint:errcheck // the client went away
}

// serveHTTP serves h on addr until stop is called.
func serveHTTP(addr string, h http.Handler, logger *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, usageError("--http-addr: %v", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server", "err", err)
		}
	}()
	logger.Info("serving /metrics, /healthz, /readyz", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx) //nolint:errcheck // closing on exit
		<-done
	}, nil
}
