// Command orders is idemq's end-to-end demo, an orders service under
// injected trouble:
//
//   - clients POST /orders behind the Idempotency-Key middleware (request
//     records in Postgres); some retry with the same key, one reuses a key
//     with another body;
//   - each order, its outbox messages and its webhook fan-out commit in one
//     transaction with the request record;
//   - a relay publishes the outbox to Kafka (billing), NATS JetStream
//     (shipping) and a partner's webhook endpoint; a first relay, a child
//     process, is SIGKILLed between a publish and the commit that deletes
//     what it published;
//   - the producer re-sends some messages; each consumer is killed once
//     between its database commit and its acknowledgement; the partner's
//     endpoint answers 503 for a while, then recovers.
//
// It prints a line per phase as it goes, then a table of what was injected
// and what was applied, and exits non-zero unless every order was charged,
// shipped and notified exactly once.
//
// It needs only Postgres, at DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), where it drops and recreates
// the schema orders_demo on every run; `make demo` starts a private server
// from the machine's Postgres binaries when nothing answers there. Kafka is
// KAFKA_BROKERS or kfake, an in-process Kafka for trying it locally; NATS is
// NATS_URL or an in-process nats-server.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

const (
	orders     = 200 // orders the clients place
	retryEvery = 5   // every 5th order is sent twice with the same key
	relayBatch = 50  // outbox rows per relay batch

	schema = "orders_demo" // holds the demo's tables; recreated on every run
)

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if spec := os.Getenv(relayChildEnv); spec != "" {
		err := relayChild(spec)
		fmt.Fprintln(os.Stderr, "relay child:", err)
		os.Exit(1)
	}
	// Ctrl-C ends the run cleanly: the brokers stop, the children die.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	connString := cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres")
	if err := run(ctx, os.Stdout, orders, connString); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// row is one leg's counts.
type row struct {
	effect, desc      string // "charges", "applied by the billing consumer on Kafka"
	injected          int    // extra copies the producer re-sent
	applied, distinct int    // effect rows, distinct message ids among them
}

// effects counts the effect rows of consumer, and the distinct messages
// among them: a message applied twice shows as two rows.
func effects(ctx context.Context, pool *pgxpool.Pool, consumer string) (rows, distinct int, err error) {
	err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM effects WHERE consumer = $1`, consumer).Scan(&rows, &distinct)
	return rows, distinct, err
}

// progress returns a func that prints one line on out, from any goroutine.
func progress(out io.Writer) func(format string, args ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "  "+format+"\n", args...)
	}
}

// inSchema returns connString with its connections' search_path set to
// schema, for the pools of this process and of the relay child.
func inSchema(connString string) string {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return connString + " search_path=" + schema
}

// run runs the demo on the database at connString, in schema.
func run(ctx context.Context, out io.Writer, n int, connString string) (err error) {
	fmt.Fprintf(out, "orders demo: %d orders through HTTP, the outbox, Kafka, JetStream and webhooks, with trouble injected\n", n)
	say := progress(out)
	connString = inSchema(connString)
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		return err
	}
	defer pool.Close()
	name := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+name+` CASCADE; CREATE SCHEMA `+name+`;
		CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, item text NOT NULL, qty int NOT NULL);
		-- one row per application (charge, shipment, webhook): a message applied twice would show twice
		CREATE TABLE effects (seq bigserial PRIMARY KEY, consumer text NOT NULL, msg_id text NOT NULL, payload text NOT NULL)`); err != nil {
		return err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{Schema: schema})
	if err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return err
	}
	for _, migrate := range []func(context.Context) error{ob.Migrate, reg.Migrate, store.Migrate} {
		if err := migrate(ctx); err != nil {
			return err
		}
	}

	say("database ready: orders, outbox, webhook registry and request records migrated")

	var legs []leg
	defer func() {
		for _, l := range legs {
			err = errors.Join(err, l.Close())
		}
	}()
	for _, start := range legFactories() {
		l, err := start(ctx)
		if err != nil {
			return fmt.Errorf("start leg: %w", err)
		}
		legs = append(legs, l)
		name, _ := l.Consumer()
		say("%s broker started in-process, for the %s consumer", l.Name(), name)
	}

	// The partner receives "order.created" webhooks.
	secret := signing.NewSecret()
	partner, err := startPartner(ctx, pool, secret)
	if err != nil {
		return err
	}
	defer partner.srv.Close()
	if _, err := reg.Add(ctx, endpoints.Endpoint{URL: partner.srv.URL + "/webhooks", Keys: []string{secret}, EventTypes: []string{"order.created"}}); err != nil {
		return err
	}

	pub, err := endpoints.NewPublisher(reg, ob)
	if err != nil {
		return err
	}
	a := &api{pool: pool, store: store, ob: ob, pub: pub, legs: legs, sent: make(map[string][]relay.Message)}
	srv, err := a.serve()
	if err != nil {
		return err
	}
	defer srv.Close()

	say("placing %d orders over HTTP, every %dth sent twice with the same key…", n, retryEvery)
	clients, err := placeOrders(ctx, srv.URL, n, retryEvery)
	if err != nil {
		return err
	}
	say("%d requests answered: %d orders created, %d replayed from the stored response, %d refused (key reused with another body)",
		clients.requests, clients.created, clients.replays, clients.rejected)

	// A first relay runs in a child process and is killed between a
	// publish and its commit.
	spec := relaySpec{DatabaseURL: connString}
	for _, l := range legs {
		spec.Sinks = append(spec.Sinks, l.SinkSpec())
	}
	say("starting a relay in a child process, to SIGKILL it between a publish and its commit…")
	republished, err := killRelay(ctx, spec)
	if err != nil {
		return err
	}
	say("relay child killed after publishing %d messages; their outbox rows survive", republished)

	// The relay that takes over publishes everything the killed one left.
	sinks := make(map[string]relay.Sink, len(legs))
	for _, l := range legs {
		sinks[l.Destination()] = l.Sink()
	}
	rl, err := newRelay(pool, ob, reg, sinks)
	if err != nil {
		return err
	}
	relaying, err := idemq.Start(ctx, rl)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, relaying.Stop()) }()
	say("second relay running; consumers start, each to be killed once between commit and ack…")

	rows := make([]row, len(legs))
	var wg sync.WaitGroup
	errs := make([]error, len(legs))
	for i, l := range legs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows[i], errs[i] = runLeg(ctx, pool, l, a.sent[l.Name()])
			if errs[i] == nil {
				name, _ := l.Consumer()
				say("%s consumer done: %d %s for %d messages, with %d re-sent copies and one crash injected",
					name, rows[i].applied, rows[i].effect, rows[i].distinct, rows[i].injected)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	say("waiting for the partner's webhooks…")
	webhooks, webhooksDistinct, err := waitWebhooks(ctx, pool, ob, clients.created)
	if err != nil {
		return err
	}
	say("partner applied %d webhooks after %d failed deliveries (503s)", webhooksDistinct, partner.outage())
	var created int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&created); err != nil {
		return err
	}

	injected := republished
	for _, r := range rows {
		injected += r.injected
	}
	fmt.Fprintln(out)
	t := table{out: out}
	t.info("HTTP requests", clients.requests, "POST /orders, each with an Idempotency-Key")
	t.check("replayed", clients.replays, clients.requests-n-1, "retries with the same key: the stored response, no new order")
	t.check("refused with 422", clients.rejected, 1, "a key reused with another body")
	t.check("orders created", created, n, "one per distinct key")
	t.info("duplicates injected", injected, fmt.Sprintf("producer re-sends, and the killed relay's published batch (%d) sent again", republished))
	t.info("crashes injected", len(legs)+1, "each consumer killed between commit and ack, the relay SIGKILLed between publish and delete")
	t.info("webhook failures", partner.outage(), "503s from the partner's endpoint before it recovered")
	for _, r := range rows {
		t.check(r.effect, r.applied, created, r.desc)
		t.check("  distinct", r.distinct, created, "")
	}
	t.check("webhooks applied", webhooks, created, "order.created received by the partner (receiving middleware, inbox)")
	t.check("  distinct", webhooksDistinct, created, "")
	if err := t.flush(); err != nil {
		return err
	}
	if t.failed > 0 {
		return fmt.Errorf("%d counts are off", t.failed)
	}
	fmt.Fprintln(out, "\nOK: every order was created once, charged once, shipped once and notified once")
	return nil
}

// waitWebhooks waits until the outbox is empty and the partner applied
// want webhooks, or the context ends, and returns what it applied.
func waitWebhooks(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, want int) (applied, distinct int, err error) {
	for {
		stats, err := ob.Stats(ctx)
		if err != nil {
			return 0, 0, err
		}
		if applied, distinct, err = effects(ctx, pool, "webhook"); err != nil {
			return 0, 0, err
		}
		if stats.Dead != 0 {
			return applied, distinct, fmt.Errorf("%d outbox messages became dead letters", stats.Dead)
		}
		if stats.Pending == 0 && distinct >= want {
			return applied, distinct, nil
		}
		select {
		case <-ctx.Done():
			return applied, distinct, fmt.Errorf("webhooks: %d of %d applied, %d outbox messages pending: %w", distinct, want, stats.Pending, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// table prints the demo's result, one count a line, and counts the
// lines whose count is not the expected one.
type table struct {
	out    io.Writer
	lines  [][3]string
	failed int
}

func (t *table) info(name string, n int, why string) {
	t.lines = append(t.lines, [3]string{name, fmt.Sprint(n), why})
}

func (t *table) check(name string, n, want int, why string) {
	got := fmt.Sprint(n)
	if n != want {
		t.failed++
		got = fmt.Sprintf("%d  WRONG, want %d", n, want)
	}
	t.lines = append(t.lines, [3]string{name, got, why})
}

func (t *table) flush() error {
	tw := tabwriter.NewWriter(t.out, 0, 0, 2, ' ', 0)
	for _, l := range t.lines {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", l[0], l[1], l[2])
	}
	return tw.Flush()
}

// start runs the leg's subscriber through c until Stop; it returns once the
// subscriber is ready.
func start(ctx context.Context, l leg, c *consumer.Consumer, beforeAck crashPoint) (*idemq.Running, error) {
	s, err := l.Subscriber(ctx, c, beforeAck)
	if err != nil {
		return nil, err
	}
	running, err := idemq.Start(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("%s: start the consumer: %w", l.Name(), err)
	}
	return running, nil
}

// runLeg re-sends some of the leg's messages as a retrying producer would
// (every 10th once more, every 40th four more times) while the relay
// publishes the outbox, runs a consumer that is killed between commit and
// ack after applying 30% of the messages, restarts it and waits until every
// copy published was consumed.
func runLeg(ctx context.Context, pool *pgxpool.Pool, l leg, msgs []relay.Message) (row, error) {
	name, effect := l.Consumer()
	r := row{effect: effect, desc: fmt.Sprintf("applied by the %s consumer on %s", name, l.Name())}
	sink := l.Sink()
	var again []relay.Message
	for i, m := range msgs {
		switch {
		case i%40 == 0:
			for range 4 {
				again = append(again, m)
			}
		case i%10 == 0:
			again = append(again, m)
		}
	}
	if err := sink.Publish(ctx, 0, again); err != nil {
		return r, fmt.Errorf("%s: producer re-send: %w", l.Name(), err)
	}
	r.injected = len(again)

	// Every copy published must be consumed before the counts are final:
	// outstanding counts, per message id, the deliveries still expected
	// (redeliveries after the crash come on top and are not waited for).
	dedupes := false
	if d, ok := l.(publishDeduper); ok && d.DedupesPublishes() {
		dedupes = true
	}
	var mu sync.Mutex
	outstanding := make(map[string]int, len(msgs))
	for _, m := range msgs {
		outstanding[m.ID.String()] = 1
	}
	if !dedupes {
		for _, m := range again {
			outstanding[m.ID.String()]++
		}
	}
	consumed := make(chan struct{}) // closed once nothing is outstanding

	var applied atomic.Int64
	c, err := consumer.New(pool, name, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, msg_id, payload) VALUES ($1, $2, $3)`, name, msg.ID, msg.Payload)
		return err
	}, consumer.Config{Inbox: inbox.Config{Schema: schema}, Hooks: consumer.Hooks{OnResult: func(res consumer.ResultEvent) {
		if res.Outcome == consumer.Applied {
			applied.Add(1)
		}
		if res.Settled() {
			mu.Lock()
			if n, ok := outstanding[res.Key]; ok {
				if n <= 1 {
					delete(outstanding, res.Key)
					if len(outstanding) == 0 {
						close(consumed)
					}
				} else {
					outstanding[res.Key] = n - 1
				}
			}
			mu.Unlock()
		}
	}}})
	if err != nil {
		return r, err
	}
	if err := c.Migrate(ctx); err != nil {
		return r, err
	}

	errKilled := errors.New("demo: consumer killed between commit and ack")
	first, err := start(ctx, l, c, func(_ context.Context, msgs []*consumer.Message, results []consumer.Result) error {
		for _, res := range results {
			if res.Outcome == consumer.Applied && applied.Load() >= int64(len(msgs)*3/10) {
				return errKilled
			}
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	select {
	case <-first.Done():
	case <-ctx.Done():
		return r, fmt.Errorf("%s: the consumer never crashed: %w", l.Name(), ctx.Err())
	}
	if err := first.Stop(); err == nil {
		return r, fmt.Errorf("%s: the first consumer was not killed", l.Name())
	}

	second, err := start(ctx, l, c, nil)
	if err != nil {
		return r, err
	}
	select {
	case <-consumed:
	case <-ctx.Done():
		_ = second.Stop()
		mu.Lock()
		waiting := len(outstanding)
		mu.Unlock()
		return r, fmt.Errorf("%s: %d messages still expected, %d applied: %w", l.Name(), waiting, applied.Load(), ctx.Err())
	}
	if s, ok := l.(settler); ok {
		if err := s.Settled(ctx); err != nil {
			return r, errors.Join(err, second.Stop())
		}
	}
	if err := second.Stop(); err != nil {
		return r, fmt.Errorf("%s: stop: %w", l.Name(), err)
	}
	r.applied, r.distinct, err = effects(ctx, pool, name)
	return r, err
}
