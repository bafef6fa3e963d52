// Command relay-embedded is a service that runs the outbox relay inside
// its own process, next to its own work, instead of as a separate `idemq
// relay` deployment.
//
// The orders service writes each order and its "orders.created" message in
// one transaction (outbox.EnqueueTx): both commit or neither does. The relay
// it embeds publishes the outbox to NATS JetStream, in order per customer.
// To show what happens when an acknowledgement is lost, the first publishes
// reach the stream but report a failure, as a timed-out broker ack would: the
// relay publishes those messages again with the same ids (Nats-Msg-Id), and
// the stream's duplicate window drops the copies. The service then stops
// the relay gracefully with the rest of the process. It prints what the relay
// sent and what the stream holds, and exits non-zero unless the stream holds
// every order exactly once, in order per customer.
//
// It runs as a module of its own: copy this file into a new module and `go
// run .`. It needs Postgres at DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), where it drops and recreates
// the schema relay_embedded on every run. NATS is the server at NATS_URL
// (where it recreates the stream ORDERS) or, when that is unset, a
// nats-server with JetStream started in-process, for trying it locally.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

const (
	orders    = 60 // orders the service places
	customers = 7  // the ordering keys
	lostAcks  = 2  // publishes that reach the stream but report a failure

	schema = "relay_embedded" // holds the example's tables; recreated on every run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := func() error {
		pool, err := openPool(ctx, cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres"))
		if err != nil {
			return err
		}
		defer pool.Close()
		return run(ctx, pool, os.Stdout)
	}()
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "relay-embedded: %v\n", err)
		os.Exit(1)
	}
}

// openPool opens a pool on connString whose connections work in schema,
// which it drops and recreates first so that every run starts empty.
func openPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	name := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{"DROP SCHEMA IF EXISTS " + name + " CASCADE", "CREATE SCHEMA " + name} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	return pool, nil
}

// startNATS returns the URL of NATS_URL or, when that is unset, of a
// nats-server with JetStream started in-process on a temporary directory;
// stop shuts that server down and removes the directory.
func startNATS() (url string, stop func(), err error) {
	if url := os.Getenv("NATS_URL"); url != "" {
		return url, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "relay-embedded-nats")
	if err != nil {
		return "", nil, err
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		return "", nil, errors.Join(err, os.RemoveAll(dir))
	}
	stop = func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
	srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		stop()
		return "", nil, errors.New("in-process nats-server not ready after 20s")
	}
	return srv.ClientURL(), stop, nil
}

// order is the payload of an orders.created message.
type order struct {
	ID       int64  `json:"id"`
	Customer string `json:"customer"`
}

// run is what a service of your own would do, with its pool.
func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	natsURL, stopNATS, err := startNATS()
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer stopNATS()

	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL)`); err != nil {
		return err
	}
	ob, err := outbox.New(pool, outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx); err != nil { // once, at deploy time (or `idemq migrate --components outbox`)
		return err
	}

	// JetStream: a stream on the service's subjects. Its duplicate window
	// (two minutes by default) drops a message whose Nats-Msg-Id it has
	// seen, so a re-publish after a lost ack is stored once.
	nc, err := nats.Connect(natsURL, nats.Name("orders-service"))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// A stream left by an earlier run would hold its orders too.
	if err := js.DeleteStream(ctx, "ORDERS"); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	const subject = "orders.created"
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{subject}})
	if err != nil {
		return err
	}
	sink, err := idemqnats.NewJetStreamSink(js, idemqnats.SinkConfig{})
	if err != nil {
		return err
	}

	// The embedded relay. lossy stands for a broker whose first acks get
	// lost: the messages are stored, the relay hears a failure.
	var sent, failed atomic.Int64
	lossy := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, msgs []relay.Message) error {
		if err := sink.Publish(ctx, id, msgs); err != nil {
			return err
		}
		sent.Add(int64(len(msgs)))
		if failed.Load() < lostAcks {
			failed.Add(1)
			return errors.New("ack lost after publish")
		}
		return nil
	})
	r, err := relay.New(pool, ob, lossy, relay.Config{
		BatchSize:    10,
		PollInterval: 100 * time.Millisecond,
		Retry:        idemq.Retry{BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	running, err := idemq.Start(ctx, r) // returns once the relay claims
	if err != nil {
		return err
	}
	defer running.Stop() //nolint:errcheck // stopped below; this is for the early returns

	// The service's own work: each order and its message in one transaction.
	for i := range orders {
		customer := fmt.Sprintf("customer-%d", i%customers)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var o order
			if err := tx.QueryRow(ctx, `INSERT INTO orders (customer) VALUES ($1) RETURNING id, customer`, customer).Scan(&o.ID, &o.Customer); err != nil {
				return err
			}
			payload, err := json.Marshal(o)
			if err != nil {
				return err
			}
			// Keyed by customer: a customer's messages are published in order.
			return ob.EnqueueTx(ctx, tx, outbox.Message{Destination: subject, Key: customer, Payload: payload})
		})
		if err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "placed %d orders for %d customers, each with its message in the outbox, in one transaction\n", orders, customers)

	// Wait for the outbox to drain, then stop the relay with the service.
	for {
		st, err := ob.Stats(ctx)
		if err != nil {
			return err
		}
		if st.Pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d messages still pending: %w", st.Pending, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := running.Stop(); err != nil {
		return err
	}
	fmt.Fprintf(out, "relay sent %d messages to JetStream; %d batches reported a lost ack and were sent again\n", sent.Load(), lostAcks)

	// What the stream holds: each order once, in order per customer.
	held, inOrder, err := readStream(ctx, stream)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "stream holds %d messages (%d copies dropped by its duplicate window); order kept for every customer: %v\n",
		held, sent.Load()-int64(held), inOrder)
	if held != orders || !inOrder || sent.Load() <= orders {
		return fmt.Errorf("want %d messages in the stream, in order per customer, and more than %d sent", orders, orders)
	}
	fmt.Fprintln(out, "ok: every order published exactly once, in order")
	return nil
}

// readStream reads every message of stream and reports their count and
// whether each customer's orders came in increasing id order.
func readStream(ctx context.Context, stream jetstream.Stream) (n int, inOrder bool, err error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, false, err
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, false, err
	}
	last := map[string]int64{}
	inOrder = true
	for range info.State.Msgs {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return n, false, err
		}
		var o order
		if err := json.Unmarshal(msg.Data(), &o); err != nil {
			return n, false, err
		}
		inOrder = inOrder && o.ID > last[o.Customer]
		last[o.Customer] = o.ID
		n++
	}
	return n, inOrder, nil
}
