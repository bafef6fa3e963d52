package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v3"

	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

const flagWebhookTable = "webhook-table"

// registry builds the webhook endpoint registry on db from the flags.
func registry(cmd *cli.Command, db endpoints.DB) (*endpoints.Registry, error) {
	reg, err := endpoints.NewRegistry(db, endpoints.RegistryConfig{Schema: globals(cmd).schema, Table: globals(cmd).webhookTable})
	if err != nil {
		return nil, flagConfigError(err, map[string]string{"Schema": flagSchema, "Table": flagWebhookTable})
	}
	return reg, nil
}

// redactURL hides the userinfo (user and password, either may be a
// credential) of an endpoint URL before it is printed.
func redactURL(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "(a URL that does not parse)"
	case u.User != nil:
		u.User = url.User("xxxxx")
	}
	return u.String()
}

// endpointJSON is an endpoint as the webhook commands print it: without its
// keys, which only add prints, once, and with any credential in its URL
// hidden.
type endpointJSON struct {
	ID             string     `json:"id"`
	URL            string     `json:"url"`
	EventTypes     []string   `json:"event_types"`
	Enabled        bool       `json:"enabled"`
	DisabledAt     *time.Time `json:"disabled_at,omitempty"`
	DisabledReason string     `json:"disabled_reason,omitempty"`
	FailingSince   *time.Time `json:"failing_since,omitempty"`
	// Breaker is the breaker state a relay last reported (open, half-open,
	// closed), since when and by which relay; absent until a breaker
	// first opened.
	Breaker      string     `json:"breaker,omitempty"`
	BreakerSince *time.Time `json:"breaker_since,omitempty"`
	BreakerRelay string     `json:"breaker_relay,omitempty"`
	Keys         int        `json:"keys"`
	CreatedAt    time.Time  `json:"created_at"`
}

func toEndpointJSON(e endpoints.Endpoint) endpointJSON {
	j := endpointJSON{ID: e.ID, URL: redactURL(e.URL), EventTypes: e.EventTypes, Enabled: e.Enabled(), DisabledReason: e.DisabledReason,
		Keys: len(e.Keys), CreatedAt: e.CreatedAt}
	if !e.DisabledAt.IsZero() {
		j.DisabledAt = &e.DisabledAt
	}
	if !e.FailingSince.IsZero() {
		j.FailingSince = &e.FailingSince
	}
	if e.Breaker != "" {
		j.Breaker, j.BreakerRelay = string(e.Breaker), e.BreakerRelay
		if !e.BreakerSince.IsZero() {
			j.BreakerSince = &e.BreakerSince
		}
	}
	if j.EventTypes == nil {
		j.EventTypes = []string{}
	}
	return j
}

func webhookCommand() *cli.Command {
	return &cli.Command{
		Name:  "webhook",
		Usage: "add, list, rotate the keys of, enable and disable webhook endpoints",
		Description: "Endpoints receive the outbox rows whose destination is webhook/<id> (the relay's --webhooks).\n" +
			"Migrate their tables with: idemq migrate --components webhook. Commands naming an unknown endpoint exit 5.",
		Action: groupAction,
		Commands: []*cli.Command{
			webhookAddCommand(),
			{Name: "list", Usage: "list the endpoints: enabled or disabled and why, failing since, and the breaker state a relay last reported",
				Action: webhookList},
			webhookRotateCommand(),
			{Name: "enable", Usage: "deliver again, the held rows at once and first", ArgsUsage: "ID", Action: webhookEnable},
			webhookDisableCommand(),
		},
	}
}

// webhookAddOptions are webhook add's flags, typed; validate checks them
// before anything connects.
type webhookAddOptions struct {
	endpoint endpoints.Endpoint // URL, ID, EventTypes, Timeout, Concurrency, RateLimit
	secret   string
}

func webhookAddCommand() *cli.Command {
	o := &webhookAddOptions{}
	e := &o.endpoint
	return &cli.Command{Name: "add", Usage: "register an endpoint; prints its signing secret once",
		Action: func(ctx context.Context, cmd *cli.Command) error { return webhookAdd(ctx, cmd, o) },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "url", Required: true, Usage: "http(s) URL the deliveries are POSTed to", Destination: &e.URL},
			&cli.StringFlag{Name: "id", Usage: "endpoint id (letters, digits, _.-); default a UUIDv7", Destination: &e.ID},
			&cli.StringSliceFlag{Name: "event-type", Usage: "event types it receives (repeatable); default all", Destination: &e.EventTypes},
			&cli.StringFlag{Name: "secret", Usage: "signing key (whsec_... or whsk_...); default a fresh whsec_ secret", Destination: &o.secret},
			// The registry keeps whole milliseconds, and 0 means the relay's default.
			&cli.DurationFlag{Name: "timeout", Usage: "per-delivery timeout; default the relay's", Destination: &e.Timeout,
				Validator: func(d time.Duration) error {
					if d < time.Millisecond {
						return fmt.Errorf("--timeout %v: want at least 1ms (leave it out for the relay's default)", d)
					}
					return nil
				}},
			// The registry keeps a 32-bit number.
			&cli.IntFlag{Name: "concurrency", Usage: fmt.Sprintf("deliveries in flight (at most %d); default the relay's", math.MaxInt32),
				Destination: &e.Concurrency, Validator: func(n int) error {
					if n <= 0 || n > math.MaxInt32 {
						return fmt.Errorf("--concurrency %d: want 1 to %d (leave it out for the relay's default)", n, math.MaxInt32)
					}
					return nil
				}},
			&cli.FloatFlag{Name: "rate-limit", Usage: "deliveries per second; default unlimited", Destination: &e.RateLimit,
				Validator: func(rate float64) error {
					if math.IsNaN(rate) || math.IsInf(rate, 0) || rate < 0 {
						return fmt.Errorf("--rate-limit %v: want a finite number of deliveries per second (0: unlimited)", rate)
					}
					return nil
				}},
		}}
}

// webhookRotateOptions are webhook rotate's flags, typed.
type webhookRotateOptions struct {
	secret string
	grace  time.Duration
}

func webhookRotateCommand() *cli.Command {
	o := &webhookRotateOptions{}
	return &cli.Command{Name: "rotate", Usage: "add a new signing key; the old ones sign on for --grace", ArgsUsage: "ID",
		Action: func(ctx context.Context, cmd *cli.Command) error { return webhookRotate(ctx, cmd, o) },
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "secret", Usage: "the new key; default a fresh whsec_ secret", Destination: &o.secret},
			&cli.DurationFlag{Name: "grace", Value: 24 * time.Hour, Usage: "how long the old keys keep signing", Destination: &o.grace,
				Validator: func(d time.Duration) error {
					if d < 0 {
						return errors.New("--grace must not be negative")
					}
					return nil
				}},
		}}
}

func webhookDisableCommand() *cli.Command {
	var reason string
	return &cli.Command{Name: "disable", Usage: "hold deliveries (rows stay in the outbox)", ArgsUsage: "ID",
		Action: func(ctx context.Context, cmd *cli.Command) error {
			return webhookSetState(ctx, cmd, func(reg *endpoints.Registry, _ *pgxpool.Pool, id string) (string, error) {
				return "", reg.Disable(ctx, id, reason)
			})
		},
		Flags: []cli.Flag{&cli.StringFlag{Name: "reason", Value: "disabled by an operator", Destination: &reason}}}
}

// withRegistry connects, builds the registry and runs f with it.
func withRegistry(ctx context.Context, cmd *cli.Command, f func(*endpoints.Registry, *pgxpool.Pool) error) error {
	pool, err := connect(ctx, cmd)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg, err := registry(cmd, pool)
	if err != nil {
		return err
	}
	err = f(reg, pool)
	if errors.Is(err, endpoints.ErrEndpointNotFound) {
		return withCode(exitNotFound, "%w", err)
	}
	return err
}

// endpointArg returns the one ID argument.
func endpointArg(cmd *cli.Command) (string, error) {
	if cmd.Args().Len() != 1 {
		return "", usageError("%s: want one endpoint ID", cmd.FullName())
	}
	return cmd.Args().First(), nil
}

func webhookAdd(ctx context.Context, cmd *cli.Command, o *webhookAddOptions) error {
	secret := cmp(o.secret, signing.NewSecret)
	ep := o.endpoint
	ep.Keys = []string{secret}
	return withRegistry(ctx, cmd, func(reg *endpoints.Registry, _ *pgxpool.Pool) error {
		added, err := reg.Add(ctx, ep)
		if err != nil {
			return addError(err, ep.ID)
		}
		out := struct {
			endpointJSON
			Secret string `json:"secret"`
		}{toEndpointJSON(added), secret}
		return output(cmd, out, func(t *table) {
			t.row("id", added.ID)
			t.row("url", out.URL)
			t.row("secret", secret)
			t.note("keep the secret: receivers verify deliveries with it, and it is not shown again")
		})
	})
}

func webhookList(ctx context.Context, cmd *cli.Command) error {
	return withRegistry(ctx, cmd, func(reg *endpoints.Registry, _ *pgxpool.Pool) error {
		eps, err := reg.List(ctx)
		if err != nil {
			return err
		}
		out := []endpointJSON{}
		for _, e := range eps {
			out = append(out, toEndpointJSON(e))
		}
		return output(cmd, out, func(t *table) {
			t.header("ID", "URL", "EVENTS", "STATE", "FAILING", "BREAKER", "KEYS")
			for _, e := range out {
				state := "enabled"
				if !e.Enabled {
					state = "disabled: " + clip(e.DisabledReason, 40)
				}
				failing := "-"
				if e.FailingSince != nil {
					failing = age(*e.FailingSince)
				}
				breaker := "-"
				if e.Breaker != "" {
					breaker = e.Breaker
					if e.BreakerSince != nil {
						breaker += " " + age(*e.BreakerSince)
					}
					if e.BreakerRelay != "" {
						breaker += " (" + clip(e.BreakerRelay, 30) + ")"
					}
				}
				events := strings.Join(e.EventTypes, ",")
				if events == "" {
					events = "*"
				}
				t.row(e.ID, e.URL, events, state, failing, breaker, fmt.Sprint(e.Keys))
			}
		})
	})
}

func webhookRotate(ctx context.Context, cmd *cli.Command, o *webhookRotateOptions) error {
	id, err := endpointArg(cmd)
	if err != nil {
		return err
	}
	secret := cmp(o.secret, signing.NewSecret)
	return withRegistry(ctx, cmd, func(reg *endpoints.Registry, _ *pgxpool.Pool) error {
		if err := reg.RotateKey(ctx, id, secret, o.grace); err != nil {
			if errors.Is(err, signing.ErrInvalidSigningKey) {
				return usageError("%w", err)
			}
			return err
		}
		return output(cmd, map[string]string{"id": id, "secret": secret}, func(t *table) {
			t.row("id", id)
			t.row("secret", secret)
			t.note("the old keys sign on for %v", o.grace)
		})
	})
}

func webhookEnable(ctx context.Context, cmd *cli.Command) error {
	return webhookSetState(ctx, cmd, func(_ *endpoints.Registry, pool *pgxpool.Pool, id string) (string, error) {
		// Enabling and making the rows held while it was disabled due now
		// (not at the relay's next hold interval) are one transaction: when
		// the second fails, on a database without the outbox tables for
		// instance, the endpoint is left as it was.
		var n int64
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			reg, err := registry(cmd, tx)
			if err != nil {
				return err
			}
			if err := reg.Enable(ctx, id); err != nil {
				return err
			}
			ob, _, err := stores(cmd, tx)
			if err != nil {
				return err
			}
			n, err = ob.RetryNow(ctx, endpoints.DestinationPrefix+id)
			return err
		})
		return fmt.Sprintf("%d held messages due now", n), err
	})
}

// webhookSetState enables or disables the endpoint named by the argument
// and prints it, with what set has to say.
func webhookSetState(ctx context.Context, cmd *cli.Command, set func(*endpoints.Registry, *pgxpool.Pool, string) (string, error)) error {
	id, err := endpointArg(cmd)
	if err != nil {
		return err
	}
	return withRegistry(ctx, cmd, func(reg *endpoints.Registry, pool *pgxpool.Pool) error {
		said, err := set(reg, pool, id)
		if err != nil {
			return err
		}
		ep, err := reg.Get(ctx, id)
		if err != nil {
			return err
		}
		j := toEndpointJSON(ep)
		return output(cmd, j, func(t *table) {
			t.note("endpoint %s %s", id, map[bool]string{true: "enabled", false: "disabled"}[j.Enabled])
			if said != "" {
				t.note("%s", said)
			}
		})
	})
}

// addError classifies an error of Registry.Add: the database's own errors
// are failures, except a taken id; any other error is the registry refusing
// the flags before it wrote anything (the package has no sentinel for that).
func addError(err error, id string) error {
	var (
		pgErr  *pgconn.PgError
		netErr net.Error
	)
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "23505": // unique_violation
		return usageError("endpoint %s exists already", id)
	case errors.As(err, &pgErr), errors.As(err, &netErr), pgconn.Timeout(err), errors.Is(err, context.Canceled):
		return err
	default:
		return usageError("%w", err)
	}
}

// cmp returns s, or def() when s is empty.
func cmp(s string, def func() string) string {
	if s != "" {
		return s
	}
	return def()
}
