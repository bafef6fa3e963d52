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

func relayCommand() *cli.Command {
	return &cli.Command{
		Name:  "relay",
		Usage: "run the outbox relay: publish outbox messages to Kafka, NATS and webhook endpoints",
		Description: "Routes map destinations to sinks: --route 'orders.*=kafka' --route 'shipping.*=jetstream:SHIPPING.in'.\n" +
			"Kafka sinks: kafka (kafka-go, the default), franz (franz-go, idempotent producer), kafka-tx (franz-go, one Kafka\n" +
			"transaction per outbox partition and batch, fenced by the relay's leases: exactly once for read_committed consumers;\n" +
			"--kafka-tx-id-prefix and --kafka-watermark-topic must be unique to the outbox).\n" +
			"SIGTERM or Ctrl-C stops claiming; batches in flight get --shutdown-grace to finish, the rest is released, not lost.\n" +
			"--http-addr serves /metrics (Prometheus), /healthz (the relay loop is running) and /readyz\n" +
			"(database reachable, schema current, relay claiming).\n" +
			"Each message sent gets a span whose traceparent goes on in its headers; with OTEL_EXPORTER_OTLP_ENDPOINT set,\n" +
			"metrics and spans are also exported over OTLP/HTTP.\n" +
			"It exits 4 when migrations are pending, unless --migrate applies them first.\n" +
			"--check validates the flags, environment and --config file without contacting anything: exit 0 or 2.",
		Flags: []cli.Flag{
			&cli.StringSliceFlag{Name: "route", Usage: "PATTERN=SINK[:TARGET]; SINK is kafka, franz, kafka-tx, jetstream or nats; PATTERN may end in *",
				Sources: cli.EnvVars("IDEMQ_ROUTES")},
			&cli.StringSliceFlag{Name: "kafka-brokers", Usage: "Kafka bootstrap brokers host:port", Sources: cli.EnvVars("IDEMQ_KAFKA_BROKERS")},
			&cli.StringFlag{Name: "kafka-tx-id-prefix", Value: kafkaTxIDPrefixDefault, Usage: "kafka-tx routes: transactional.id prefix (+ outbox partition)",
				Sources: cli.EnvVars("IDEMQ_KAFKA_TX_ID_PREFIX")},
			&cli.StringFlag{Name: "kafka-watermark-topic", Value: kafkaWatermarkTopicDefault, Usage: "kafka-tx routes: compacted topic of the watermarks (created if missing)",
				Sources: cli.EnvVars("IDEMQ_KAFKA_WATERMARK_TOPIC")},
			&cli.StringFlag{Name: "nats-url", Usage: "NATS server URL", Sources: cli.EnvVars("IDEMQ_NATS_URL", "NATS_URL")},
			&cli.BoolFlag{Name: "webhooks", Usage: "deliver webhook/<endpoint> destinations to the registered webhook endpoints",
				Sources: cli.EnvVars("IDEMQ_WEBHOOKS")},
			&cli.StringSliceFlag{Name: "webhook-allow-network", Usage: "CIDR the webhook SSRF guard lets through (repeatable)",
				Sources: cli.EnvVars("IDEMQ_WEBHOOK_ALLOW_NETWORKS")},
			&cli.StringFlag{Name: "config", Usage: "JSON file with routes, kafka_brokers, kafka_tx_id_prefix, kafka_watermark_topic, nats_url, webhooks and webhook_allow_networks, for what the flags leave unset",
				Sources: cli.EnvVars("IDEMQ_CONFIG")},
			&cli.StringFlag{Name: "http-addr", Usage: "address for /metrics, /healthz and /readyz (empty: none)",
				Sources: cli.EnvVars("IDEMQ_HTTP_ADDR")},
			&cli.BoolFlag{Name: "migrate", Usage: "apply pending migrations before starting", Sources: cli.EnvVars("IDEMQ_MIGRATE")},
			&cli.BoolFlag{Name: "check", Usage: "check the flags, environment and --config file, print the relay's settings and exit (0 valid, 2 not); contacts no database or broker"},
			&cli.IntFlag{Name: "workers", Usage: "batches in flight at once", Value: relay.WorkersDefault, Sources: cli.EnvVars("IDEMQ_RELAY_WORKERS")},
			&cli.IntFlag{Name: "batch-size", Usage: "rows per claim", Value: relay.BatchSizeDefault, Sources: cli.EnvVars("IDEMQ_RELAY_BATCH_SIZE")},
			&cli.IntFlag{Name: "max-attempts", Usage: "failed publishes before a dead letter", Value: relay.RetryDefault.MaxAttempts,
				Sources: cli.EnvVars("IDEMQ_RELAY_MAX_ATTEMPTS")},
			&cli.DurationFlag{Name: "poll-interval", Value: relay.PollIntervalDefault, Usage: "how often an idle relay looks for rows without a NOTIFY", Sources: cli.EnvVars("IDEMQ_RELAY_POLL_INTERVAL")},
			&cli.DurationFlag{Name: "lease-ttl", Value: relay.LeaseTTLDefault, Usage: "how long a dead relay's key partitions wait before other relays take them over",
				Sources: cli.EnvVars("IDEMQ_RELAY_LEASE_TTL")},
			&cli.DurationFlag{Name: "shutdown-grace", Value: relay.ShutdownGraceDefault, Usage: "time in-flight batches get after SIGTERM",
				Sources: cli.EnvVars("IDEMQ_SHUTDOWN_GRACE")},
			&cli.DurationFlag{Name: "stats-interval", Value: relay.StatsIntervalDefault, Usage: "how often the backlog gauges refresh",
				Sources: cli.EnvVars("IDEMQ_RELAY_STATS_INTERVAL")},
			&cli.BoolFlag{Name: "park-followers", Usage: "hold a key's later messages while an earlier one is a dead letter",
				Sources: cli.EnvVars("IDEMQ_RELAY_PARK_FOLLOWERS")},
			&cli.StringFlag{Name: "listen-url", Usage: "direct Postgres connection for LISTEN when --database-url goes through a transaction-mode pooler such as PgBouncer (empty: the database URL)",
				Sources: cli.EnvVars("IDEMQ_LISTEN_URL")},
			&cli.BoolFlag{Name: "poll-only", Usage: "do not LISTEN: find new messages by polling every --poll-interval",
				Sources: cli.EnvVars("IDEMQ_RELAY_POLL_ONLY")},
			&cli.DurationFlag{Name: "stall-threshold", Value: relay.StallThresholdDefault, Usage: "log a stall when a message free to go has been due this long",
				Sources: cli.EnvVars("IDEMQ_RELAY_STALL_THRESHOLD")},
			&cli.StringFlag{Name: "log-format", Value: "json", Usage: "log format on stderr: json or text", Sources: cli.EnvVars("IDEMQ_LOG_FORMAT")},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "least level logged: debug, info, warn or error", Sources: cli.EnvVars("IDEMQ_LOG_LEVEL")},
			componentsFlag("outbox"),
		},
		Action: runRelay,
	}
}

func runRelay(ctx context.Context, cmd *cli.Command) error {
	// Every flag is checked before the relay touches the database or a
	// broker: a typo must not migrate anything, and is a usage error (2)
	// whether or not the database answers.
	logger, err := newLogger(cmd.Root().ErrWriter, cmd.String("log-format"), cmd.String("log-level"))
	if err != nil {
		return err
	}
	sc, err := relaySinkConfig(cmd)
	if err != nil {
		return err
	}
	plan, err := sc.plan()
	if err != nil {
		return err
	}
	if err := explicitZeros(cmd); err != nil {
		return err
	}
	comps, err := components(cmd)
	if err != nil {
		return err
	}
	if sc.Webhooks && !slices.ContainsFunc(comps, func(c component) bool { return c.name == "webhook" }) {
		// The webhook Sink reads the registry: its tables must be current too.
		comps = append(comps, allComponents(cmd)["webhook"])
	}
	pool, err := openPool(cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, _, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	m, err := migrator(pool, comps)
	if err != nil {
		return err
	}
	reg, err := registry(cmd, pool)
	if err != nil {
		return err
	}
	cfg := relay.Config{
		Workers:          cmd.Int("workers"),
		BatchSize:        cmd.Int("batch-size"),
		PollInterval:     cmd.Duration("poll-interval"),
		LeaseTTL:         cmd.Duration("lease-ttl"),
		ShutdownGrace:    cmd.Duration("shutdown-grace"),
		StatsInterval:    cmd.Duration("stats-interval"),
		ParkFollowers:    cmd.Bool("park-followers"),
		StallThreshold:   cmd.Duration("stall-threshold"),
		ListenConnString: cmd.String("listen-url"),
		DisableListen:    cmd.Bool("poll-only"),
		Retry:            idemq.Retry{MaxAttempts: cmd.Int("max-attempts")},
		Logger:           logger,
	}
	if cmd.Bool("check") {
		return checkRelay(cmd, pool, ob, cfg, sc)
	}
	tel, err := outboxTelemetry(ctx, ob)
	if err != nil {
		return err
	}
	defer tel.shutdown() //nolint:errcheck // best effort on exit
	cfg.Hooks = tel.RelayHooks(relay.Hooks{})
	router := relay.NewRouter() // routed by buildSinks, before Run
	r, err := relay.New(pool, ob, router, cfg)
	if err != nil {
		return relayConfigError(err)
	}

	if err := ping(ctx, cmd, pool); err != nil {
		return err
	}
	if cmd.Bool("migrate") {
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
	if plan.outbox, err = relay.OutboxName(ctx, pool, ob); err != nil {
		return err
	}
	s, err := buildSinks(plan, router, reg, tel.Telemetry)
	if err != nil {
		return err
	}
	defer s.close()

	h := &health{pool: pool, relay: r, migrator: m}
	if addr := cmd.String("http-addr"); addr != "" {
		stop, err := serveHTTP(addr, h.handler(tel.registry), logger)
		if err != nil {
			return err
		}
		defer stop()
	}
	h.running.Store(true)
	logger.Info("relay starting", "schema", ob.Config().Schema, "outbox", ob.Config().Table, "routes", sc.Routes)
	err = r.Run(ctx)
	h.running.Store(false)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// checkRelay is relay --check: everything runRelay checks before it
// reaches the database, plus what the relay itself refuses at
// construction (relay.New contacts nothing) and the --http-addr syntax.
// It prints the settings the relay would run with. The OpenTelemetry
// setup is not built: its exporters would flush to the OTLP endpoint on
// shutdown.
func checkRelay(cmd *cli.Command, pool *pgxpool.Pool, ob *outbox.Outbox, cfg relay.Config, sc sinkConfig) error {
	if _, err := relay.New(pool, ob, relay.NewRouter(), cfg); err != nil {
		return relayConfigError(err)
	}
	addr := cmd.String("http-addr")
	if addr != "" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return usageError("--http-addr %q: %v", addr, err)
		}
	}
	cc := pool.Config().ConnConfig
	settings := relayCheck{OK: true, Database: fmt.Sprintf("%s:%d/%s", cc.Host, cc.Port, cc.Database), Schema: ob.Config().Schema,
		Outbox: ob.Config().Table, Routes: sc.Routes, KafkaBrokers: sc.KafkaBrokers, NATSURL: redactURL(sc.NATSURL),
		Webhooks: sc.Webhooks, WebhookAllowNetworks: sc.WebhookAllowNetworks, HTTPAddr: addr,
		Workers: cmd.Int("workers"), BatchSize: cmd.Int("batch-size"), MaxAttempts: cmd.Int("max-attempts")}
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
		t.row("nats url", settings.NATSURL)
		t.row("webhook allow networks", strings.Join(settings.WebhookAllowNetworks, ","))
		t.row("http addr", addr)
		t.row("workers", strconv.Itoa(settings.Workers))
		t.row("batch size", strconv.Itoa(settings.BatchSize))
		t.row("max attempts", strconv.Itoa(settings.MaxAttempts))
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
	NATSURL              string   `json:"nats_url"`
	Webhooks             bool     `json:"webhooks"`
	WebhookAllowNetworks []string `json:"webhook_allow_networks"`
	HTTPAddr             string   `json:"http_addr"`
	Workers              int      `json:"workers"`
	BatchSize            int      `json:"batch_size"`
	MaxAttempts          int      `json:"max_attempts"`
}

// newLogger returns the relay's logger on w: format json or text, at
// level (debug, info, warn, error) and above.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usageError("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
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
	"LeaseTTL": "lease-ttl", "ShutdownGrace": "shutdown-grace", "StatsInterval": "stats-interval", "Retry.MaxAttempts": "max-attempts", "StallThreshold": "stall-threshold"}

// relayConfigError is configError naming the flag, not the Go field, of a
// value relay.New refused.
func relayConfigError(err error) error { return flagConfigError(err, relayFlags) }

// explicitZeros refuses a relay flag given as 0 (or less): relay.Config
// takes zero for its default, so --shutdown-grace 0 would silently be 10
// seconds, and --max-attempts 0 ten attempts.
func explicitZeros(cmd *cli.Command) error {
	for _, name := range []string{"workers", "batch-size", "max-attempts"} {
		if cmd.IsSet(name) && cmd.Int(name) <= 0 {
			return usageError("--%s %d: want a positive number (leave it out for the default)", name, cmd.Int(name))
		}
	}
	for _, name := range []string{"poll-interval", "lease-ttl", "shutdown-grace", "stats-interval", "stall-threshold"} {
		if cmd.IsSet(name) && cmd.Duration(name) <= 0 {
			return usageError("--%s %v: want a positive duration (leave it out for the default)", name, cmd.Duration(name))
		}
	}
	return nil
}

// relaySinkConfig reads the sink flags and, for what they leave unset,
// the --config file.
func relaySinkConfig(cmd *cli.Command) (sinkConfig, error) {
	sc := sinkConfig{Routes: cmd.StringSlice("route"), KafkaBrokers: cmd.StringSlice("kafka-brokers"), NATSURL: cmd.String("nats-url"),
		KafkaTxIDPrefix: cmd.String("kafka-tx-id-prefix"), KafkaWatermarkTopic: cmd.String("kafka-watermark-topic"),
		Webhooks: cmd.Bool("webhooks"), WebhookAllowNetworks: cmd.StringSlice("webhook-allow-network")}
	path := cmd.String("config")
	if path == "" {
		return sc, nil
	}
	file, err := readSinkConfig(path)
	if err != nil {
		return sc, err
	}
	if !cmd.IsSet("route") {
		sc.Routes = file.Routes
	}
	if !cmd.IsSet("kafka-brokers") {
		sc.KafkaBrokers = file.KafkaBrokers
	}
	if !cmd.IsSet("nats-url") {
		sc.NATSURL = file.NATSURL
	}
	if !cmd.IsSet("kafka-tx-id-prefix") && file.KafkaTxIDPrefix != "" {
		sc.KafkaTxIDPrefix = file.KafkaTxIDPrefix
	}
	if !cmd.IsSet("kafka-watermark-topic") && file.KafkaWatermarkTopic != "" {
		sc.KafkaWatermarkTopic = file.KafkaWatermarkTopic
	}
	if !cmd.IsSet("webhooks") {
		sc.Webhooks = file.Webhooks
	}
	if !cmd.IsSet("webhook-allow-network") {
		sc.WebhookAllowNetworks = file.WebhookAllowNetworks
	}
	return sc, nil
}

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
