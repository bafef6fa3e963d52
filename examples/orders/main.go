// Command orders is idemq's end-to-end demo: business transactions enqueue
// order messages in the outbox, the relay publishes them to every transport
// leg (Kafka on an in-process broker, and any leg another transport
// registers), the
// producer re-sends some of them, and a consumer wrapped by idemq applies
// them to a shipments table, killed once between its database commit and
// its acknowledgement and restarted. It prints, per transport, what was
// sent, the duplicates injected and what was applied, and exits non-zero
// unless every leg applied each distinct message exactly once.
//
// It needs only the local Postgres (IDEMQ_TEST_DATABASE_URL points it
// elsewhere); it creates its own database and drops it on exit.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

const (
	orders     = 200 // business transactions, one message per leg each
	crashAfter = 60  // the first consumer dies after applying this many
	relayBatch = 50  // outbox rows per relay batch
)

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// row is one leg's line of the table.
type row struct {
	leg               string
	sent              int // distinct messages published
	injected          int // extra copies the producer re-sent
	brokerDropped     int // copies the broker itself dropped (JetStream's duplicate window)
	dropped           int // deliveries the inbox recognised as duplicates
	applied, distinct int // shipment rows, distinct message ids among them
}

func (r row) ok() bool { return r.applied == r.sent && r.distinct == r.sent }

func run(ctx context.Context, out io.Writer) (err error) {
	connString, drop, err := testenv.CreateDatabase(ctx, "idemq_demo")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, drop()) }()
	pool, err := pgxpool.New(ctx, connString)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL, item text NOT NULL, qty int NOT NULL);
		-- one row per application: a message applied twice would show twice
		CREATE TABLE shipments (seq bigserial PRIMARY KEY, leg text NOT NULL, msg_id text NOT NULL, payload text NOT NULL)`); err != nil {
		return err
	}

	var legs []leg
	defer func() {
		for _, l := range legs {
			err = errors.Join(err, l.Close())
		}
	}()
	for _, start := range legFactories {
		l, err := start(ctx)
		if err != nil {
			return fmt.Errorf("start leg: %w", err)
		}
		legs = append(legs, l)
	}

	// The relay drains the outbox into every leg, routed by destination.
	ob, err := outbox.New(outbox.Config{})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx, pool); err != nil {
		return err
	}
	router := relay.NewRouter()
	for _, l := range legs {
		if err := router.Route(l.Destination(), l.Sink()); err != nil {
			return err
		}
	}
	rl, err := relay.New(pool, ob, router, relay.Config{BatchSize: relayBatch, PollInterval: 50 * time.Millisecond,
		RetryBase: 10 * time.Millisecond, RetryCap: time.Second})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.Run(relayCtx) }()
	defer func() {
		stopRelay()
		err = errors.Join(err, <-relayDone)
	}()

	perLeg, err := produce(ctx, pool, ob, legs)
	if err != nil {
		return err
	}

	rows := make([]row, len(legs))
	var wg sync.WaitGroup
	errs := make([]error, len(legs))
	for i, l := range legs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rows[i], errs[i] = runLeg(ctx, pool, l, perLeg[l.Name()])
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	stats, err := ob.Stats(ctx, pool)
	if err != nil {
		return err
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\tsent\tduplicates injected\tredelivered after crash\tdropped by broker\tdropped by inbox\tapplied\t")
	failed := false
	for _, r := range rows {
		redelivered := r.dropped - (r.injected - r.brokerDropped)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", r.leg, r.sent, r.injected, redelivered, r.brokerDropped, r.dropped, r.applied)
		failed = failed || !r.ok()
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "outbox: %d messages enqueued in %d business transactions, %d pending, %d dead letters\n",
		orders*len(legs), orders, stats.Pending, stats.Dead)
	if failed {
		return errors.New("a leg did not apply every distinct message exactly once")
	}
	if stats.Pending != 0 || stats.Dead != 0 {
		return errors.New("the relay did not publish the whole outbox")
	}
	fmt.Fprintln(out, "every distinct message applied exactly once on every transport")
	return nil
}

// produce runs the business transactions: each inserts an order and
// enqueues, in the same transaction, one message per leg, keyed by
// customer so that a customer's orders stay in order. It returns the
// messages per leg, for the producer's re-sends.
func produce(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, legs []leg) (map[string][]relay.Message, error) {
	perLeg := make(map[string][]relay.Message, len(legs))
	for n := range orders {
		customer := fmt.Sprintf("customer-%d", n%17)
		var batch []relay.Message
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			batch = batch[:0]
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO orders (customer, item, qty) VALUES ($1, $2, $3) RETURNING id`,
				customer, fmt.Sprintf("item-%d", n%5), 1+n%3).Scan(&id); err != nil {
				return err
			}
			msgs := make([]outbox.Message, len(legs))
			for i, l := range legs {
				msgs[i] = outbox.Message{
					ID:          uuid.Must(uuid.NewV7()),
					Destination: l.Destination(),
					Key:         customer,
					Payload:     fmt.Appendf(nil, `{"order_id":%d,"customer":%q}`, id, customer),
					Headers:     map[string]string{"Content-Type": "application/json"},
				}
				batch = append(batch, relay.Message{ID: msgs[i].ID, Destination: msgs[i].Destination, Key: msgs[i].Key,
					Payload: msgs[i].Payload, Headers: msgs[i].Headers})
			}
			return ob.Enqueue(ctx, tx, msgs...)
		})
		if err != nil {
			return nil, fmt.Errorf("order transaction: %w", err)
		}
		for i, l := range legs {
			perLeg[l.Name()] = append(perLeg[l.Name()], batch[i])
		}
	}
	return perLeg, nil
}

// runLeg re-sends some of the leg's messages as a retrying producer would
// (every 10th once more, every 40th four more times) while the relay
// publishes the outbox, runs a consumer that is killed between commit and
// ack after crashAfter applications, restarts it and waits until every
// copy published was consumed.
func runLeg(ctx context.Context, pool *pgxpool.Pool, l leg, msgs []relay.Message) (row, error) {
	r := row{leg: l.Name(), sent: len(msgs)}
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
	if err := sink.Publish(ctx, again); err != nil {
		return r, fmt.Errorf("%s: producer re-send: %w", l.Name(), err)
	}
	r.injected = len(again)

	// Every copy published must be consumed before the counts are final:
	// outstanding counts, per message id, the deliveries still expected
	// (redeliveries after the crash come on top and are not waited for).
	dedupes := false
	if d, ok := l.(publishDeduper); ok && d.DedupesPublishes() {
		dedupes = true
		r.brokerDropped = len(again)
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
	waiting := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(outstanding)
	}

	var applied, dropped atomic.Int64
	c, err := consumer.New(pool, "shipping-"+l.Name(), func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (leg, msg_id, payload) VALUES ($1, $2, $3)`, l.Name(), msg.ID, msg.Payload)
		return err
	}, consumer.Config{Hooks: consumer.Hooks{OnResult: func(_ string, res consumer.Result) {
		switch res.Outcome {
		case consumer.Applied:
			applied.Add(1)
		case consumer.Duplicate:
			dropped.Add(1)
		}
		if res.Settled() {
			mu.Lock()
			if outstanding[res.Key]--; outstanding[res.Key] <= 0 {
				delete(outstanding, res.Key)
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

	first, err := l.Subscribe(ctx, c, func(_ *consumer.Message, res consumer.Result) bool {
		return res.Outcome == consumer.Applied && applied.Load() >= crashAfter
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

	second, err := l.Subscribe(ctx, c, nil)
	if err != nil {
		return r, err
	}
	for waiting() > 0 {
		select {
		case <-ctx.Done():
			_ = second.Stop()
			return r, fmt.Errorf("%s: %d messages still expected, %d applied: %w", l.Name(), waiting(), applied.Load(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := second.Stop(); err != nil {
		return r, fmt.Errorf("%s: stop: %w", l.Name(), err)
	}
	r.dropped = int(dropped.Load())
	err = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM shipments WHERE leg = $1`, l.Name()).Scan(&r.applied, &r.distinct)
	return r, err
}
