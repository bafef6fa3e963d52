// Command kafka-consumer is a Kafka consumer that applies every message
// once, and nothing else: no outbox, no relay.
//
// A payments producer (any Kafka client) sends each payment with its id in
// the Idempotency-Key header, then re-sends some of them, as a producer
// whose acknowledgement was lost does, and once reuses an id with another
// amount, a producer bug. The ledger service reads the topic through a
// kafka.Subscriber wrapped around a consumer.Consumer: each payment's ledger
// row and its inbox record commit in one transaction, so a re-sent payment
// is acknowledged as a duplicate without a second row, and the reused id is
// a conflict, never applied. It prints the outcomes and the ledger, and
// exits non-zero unless each payment was booked exactly once.
//
// It runs as a module of its own: copy this file into a new module and `go
// run .`. It needs Postgres at DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), where it drops and recreates
// the schema kafka_consumer on every run. Kafka is the brokers in
// KAFKA_BROKERS (comma-separated; it creates the topic "payments" there) or,
// when that is unset, kfake, an in-process Kafka for trying it locally. In a
// service, the pool and the brokers are your own; the rest stays as it is.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/transports/kafka"
)

const (
	payments = 30 // distinct payments produced
	resent   = 8  // of which the producer sends again

	schema = "kafka_consumer" // holds the example's tables; recreated on every run
	topic  = "payments"
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
		fmt.Fprintf(os.Stderr, "kafka-consumer: %v\n", err)
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

// startKafka returns the brokers of KAFKA_BROKERS, with the topic created
// there, or those of a kfake cluster holding the topic; stop ends kfake.
func startKafka(ctx context.Context) (brokers []string, stop func(), err error) {
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		brokers = strings.Split(env, ",")
		client := &kafkago.Client{Addr: kafkago.TCP(brokers...)}
		resp, err := client.CreateTopics(ctx, &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{
			{Topic: topic, NumPartitions: 3, ReplicationFactor: -1}}})
		if err == nil && !errors.Is(resp.Errors[topic], kafkago.TopicAlreadyExists) {
			err = resp.Errors[topic]
		}
		return brokers, func() {}, err
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		return nil, nil, err
	}
	return cluster.ListenAddrs(), cluster.Close, nil
}

// run is what a service of your own would do, with its pool and brokers.
func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	brokers, stopKafka, err := startKafka(ctx)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer stopKafka()

	// The ledger has no unique constraint: a payment applied twice would
	// show as two rows.
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (seq bigserial PRIMARY KEY, payment_id text NOT NULL, cents int NOT NULL)`); err != nil {
		return err
	}

	// The consumer: the handler's writes and the inbox record commit in
	// one transaction; Hooks.OnResult counts the outcomes.
	var mu sync.Mutex
	outcomes := map[consumer.Outcome]int{}
	c, err := consumer.New(pool, "ledger", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		cents, err := strconv.Atoi(string(msg.Payload))
		if err != nil {
			return idemq.Permanent(err) // no retry can fix it: a dead letter at once
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger (payment_id, cents) VALUES ($1, $2)`, msg.ID, cents)
		return err
	}, consumer.Config{Inbox: inbox.Config{Schema: schema}, Hooks: consumer.Hooks{OnResult: func(ev consumer.ResultEvent) {
		mu.Lock()
		defer mu.Unlock()
		outcomes[ev.Outcome]++
	}}})
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil { // once, at deploy time (or `idemq migrate --components inbox`)
		return err
	}
	sub, err := kafka.NewSubscriber(c, kafka.SubscriberConfig{Brokers: brokers, GroupID: "ledger", Topics: []string{topic}})
	if err != nil {
		return err
	}
	running, err := idemq.Start(ctx, sub) // returns once it joined the group
	if err != nil {
		return err
	}
	defer running.Stop() //nolint:errcheck // stopped below; this is for the early returns

	// The producer: any Kafka client, the payment id in Idempotency-Key.
	sent, err := produce(ctx, brokers)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "produced %d messages: %d payments, %d of them sent again, 1 payment id reused with another amount\n",
		sent, payments, resent)

	// Wait until every message was settled, then stop: the offsets are
	// committed only for settled messages.
	settled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return outcomes[consumer.Applied] + outcomes[consumer.Duplicate] + outcomes[consumer.Conflict] + outcomes[consumer.DeadLettered]
	}
	for settled() < sent {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d messages settled: %w", settled(), sent, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := running.Stop(); err != nil {
		return err
	}

	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT payment_id) FROM ledger`).Scan(&rows, &distinct); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(out, "consumer outcomes: %d applied, %d duplicates, %d conflicts\n",
		outcomes[consumer.Applied], outcomes[consumer.Duplicate], outcomes[consumer.Conflict])
	fmt.Fprintf(out, "ledger: %d rows for %d payments\n", rows, distinct)
	if rows != payments || distinct != payments || outcomes[consumer.Applied] != payments ||
		outcomes[consumer.Duplicate] != resent || outcomes[consumer.Conflict] != 1 {
		return fmt.Errorf("want %d rows for %d payments, %d applied, %d duplicates and 1 conflict", payments, payments, payments, resent)
	}
	fmt.Fprintln(out, "ok: every payment booked exactly once")
	return nil
}

// produce sends the payments, re-sends the first resent of them, and
// reuses the first payment's id with another amount. It returns how many
// messages it sent.
func produce(ctx context.Context, brokers []string) (int, error) {
	transport := &kafkago.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: topic, Balancer: &kafkago.Hash{},
		RequiredAcks: kafkago.RequireAll, Transport: transport}
	defer w.Close()
	payment := func(i, cents int) kafkago.Message {
		id := fmt.Sprintf("pay-%03d", i)
		return kafkago.Message{Key: []byte(id), Value: fmt.Appendf(nil, "%d", cents),
			Headers: []kafkago.Header{{Key: kafka.IDHeaderDefault, Value: []byte(id)}}}
	}
	var msgs []kafkago.Message
	for i := range payments {
		msgs = append(msgs, payment(i, 100+i))
	}
	for i := range resent { // the same messages again: the producer's retries
		msgs = append(msgs, payment(i, 100+i))
	}
	msgs = append(msgs, payment(0, 999)) // the same id, another amount
	return len(msgs), w.WriteMessages(ctx, msgs...)
}
