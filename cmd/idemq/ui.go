package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/console"
)

// uiOptions are the ui command's flags, typed.
type uiOptions struct {
	listen       string
	allowActions bool
}

func uiCommand() *cli.Command {
	o := &uiOptions{}
	return &cli.Command{
		Name:  "ui",
		Usage: "serve the operator console (and /metrics) over HTTP",
		Description: "Serves the console at / : the outbox's backlog and relays, dead letters grouped by cause, the inbox,\n" +
			"webhook endpoints, a key's lookup and the audit log; and the backlog gauges on /metrics, /healthz.\n" +
			"Read-only unless --allow-actions, and actions need a signed-in user: IDEMQ_UI_TOKEN (a bearer token,\n" +
			"or typed into the login page; IDEMQ_UI_TOKEN_NAME names its holder in the audit log, default \"token\")\n" +
			"and/or IDEMQ_UI_USER with IDEMQ_UI_PASSWORD (basic auth). When either is set every page needs it.\n" +
			"Replays and purges ask for a second, explicit confirmation, and every attempt is written to the\n" +
			"outbox's audit log. Pages of stores whose\n" +
			"tables do not exist (inbox, webhooks, request records) are left out.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "address to serve on", Sources: cli.EnvVars("IDEMQ_UI_LISTEN"),
				Destination: &o.listen},
			&cli.BoolFlag{Name: "allow-actions", Usage: "let signed-in users replay, purge, release and enable", Sources: cli.EnvVars("IDEMQ_UI_ALLOW_ACTIONS"),
				Destination: &o.allowActions},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error { return runUI(ctx, cmd, o) },
	}
}

func runUI(ctx context.Context, cmd *cli.Command, o *uiOptions) error {
	cfg := console.Config{AllowActions: o.allowActions, Token: os.Getenv("IDEMQ_UI_TOKEN"), TokenName: os.Getenv("IDEMQ_UI_TOKEN_NAME"),
		User: os.Getenv("IDEMQ_UI_USER"), Password: os.Getenv("IDEMQ_UI_PASSWORD")}
	if cfg.AllowActions && cfg.Token == "" && cfg.User == "" {
		return usageError("--allow-actions needs a signed-in user: set IDEMQ_UI_TOKEN, or IDEMQ_UI_USER and IDEMQ_UI_PASSWORD")
	}
	pool, err := connect(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	ob, ib, err := stores(cmd, pool)
	if err != nil {
		return err
	}
	cfg.DB, cfg.Outbox = pool, ob
	c := ob.Config()
	if ok, err := tableExists(ctx, pool, c.Schema, c.Table+"_audit"); err != nil {
		return err
	} else if !ok {
		return withCode(exitPending, "the outbox's tables are missing or not current (no %s.%s_audit): run idemq migrate", c.Schema, c.Table)
	}
	g := globals(cmd)
	if ok, err := tableExists(ctx, pool, g.schema, g.inboxTable); err != nil {
		return err
	} else if ok {
		cfg.Inbox = ib
	}
	if ok, err := tableExists(ctx, pool, g.schema, g.webhookTable); err != nil {
		return err
	} else if ok {
		if cfg.Webhooks, err = registry(cmd, pool); err != nil {
			return err
		}
	}
	if ok, err := tableExists(ctx, pool, g.schema, g.requestsTable); err != nil {
		return err
	} else if ok {
		// connect checked the table flags: this cannot fail.
		if cfg.Requests, err = requestStore(cmd, pool); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(cmd.Root().ErrWriter, nil))
	cfg.Logger = logger
	ui, err := console.NewHandler(cfg)
	if err != nil {
		return usageError("%w", err)
	}
	tel, err := outboxTelemetry(ctx, ob)
	if err != nil {
		return err
	}
	defer tel.shutdown() //nolint:errcheck // best effort on exit
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(tel.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := pool.Ping(r.Context()); err != nil {
			http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n")) //nolint:errcheck // the client went away
	})
	mux.Handle("/", ui)

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return usageError("--listen: %v", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	logger.Info("console serving", "addr", "http://"+ln.Addr().String()+"/", "actions", cfg.AllowActions,
		"auth", cfg.Token != "" || cfg.User != "")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// tableExists reports whether schema.table exists.
func tableExists(ctx context.Context, pool *pgxpool.Pool, schema, table string) (bool, error) {
	var ok bool
	err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, pgx.Identifier{schema, table}.Sanitize()).Scan(&ok)
	return ok, err
}
