package franz_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// benchBatches returns batches of 500 messages over 64 keys, all of one
// outbox partition under one lease token: each is one 500-record
// transaction of a TxSink.
func benchBatches(topic string, batches int) [][]relay.Message {
	out := make([][]relay.Message, batches)
	seq := int64(0)
	for i := range out {
		out[i] = make([]relay.Message, 500)
		for j := range out[i] {
			seq++
			out[i][j] = relay.Message{
				Message:   outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: topic, Key: fmt.Sprint("c-", j%64), Payload: fmt.Appendf(nil, `{"order":%d,"amount":"10.00"}`, seq)},
				Seq:       seq,
				Partition: 7, LeaseToken: 1,
			}
		}
	}
	return out
}

// sinkTime publishes batches through sink one after the other, as a
// relay worker does, and returns how long that took.
func sinkTime(b *testing.B, sink relay.Sink, batches [][]relay.Message) time.Duration {
	start := time.Now()
	for _, batch := range batches {
		if err := sink.Publish(context.Background(), 0, batch); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkSinks compares, in one run against kfake, the TxSink at
// 500-record transactions with the plain franz-go Sink (tx-ratio, the
// goal is 0.7 or more), and the franz-go Sink with the kafka-go Sink
// (franz-ratio).
func BenchmarkSinks(b *testing.B) {
	k := testenv.Kafka(b, 4, "tx", "franz", "kafkago")
	w := idemqkafka.NewWriter(k.Brokers...)
	b.Cleanup(func() { _ = w.Close() })
	kafkaGo, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		b.Fatal(err)
	}
	plain := newSink(b, k)
	tx := newTxSink(b, k, franz.TxConfig{})
	if _, err := tx.Watermark(context.Background(), 7, 1); err != nil {
		b.Fatal(err)
	}
	// The three take turns in short rounds, so that a change of the
	// machine's load falls on all of them.
	var txTime, franzTime, kafkaGoTime time.Duration
	msgs := 0
	for b.Loop() {
		for range 5 {
			txTime += sinkTime(b, tx, benchBatches(k.Topic("tx"), 12))
			franzTime += sinkTime(b, plain, benchBatches(k.Topic("franz"), 12))
			kafkaGoTime += sinkTime(b, kafkaGo, benchBatches(k.Topic("kafkago"), 12))
			msgs += 12 * 500
		}
	}
	txRate, franzRate, kafkaGoRate := float64(msgs)/txTime.Seconds(), float64(msgs)/franzTime.Seconds(), float64(msgs)/kafkaGoTime.Seconds()
	b.ReportMetric(txRate, "tx-msgs/s")
	b.ReportMetric(franzRate, "franz-msgs/s")
	b.ReportMetric(kafkaGoRate, "kafka-go-msgs/s")
	b.ReportMetric(txRate/franzRate, "tx-ratio")
	b.ReportMetric(franzRate/kafkaGoRate, "franz-ratio")
}

// BenchmarkSubscribers compares, in one run against kfake, the franz-go
// Subscriber with the kafka-go Subscriber, both in Batch mode
// (consumer.ProcessBatch) over the same 4-partition topic.
func BenchmarkSubscribers(b *testing.B) {
	const n = 5000
	k := testenv.Kafka(b, 4, "orders")
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: k.Topic("orders"), Key: fmt.Appendf(nil, "c-%d", i%64), Value: fmt.Appendf(nil, `{"order":%d}`, i),
			Headers: []kgo.RecordHeader{{Key: franz.IDHeaderDefault, Value: []byte(uuid.Must(uuid.NewV7()).String())}}}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	cl.Close()
	pool := benchPool(b)
	var franzRate, kafkaGoRate float64
	for i := 0; b.Loop(); i++ {
		franzRate += subscribeRate(b, pool, n, fmt.Sprint("franz-", i), func(c *consumer.Consumer, group string) idemq.Service {
			s, err := franz.NewSubscriber(c, franz.SubscriberConfig{GroupID: k.Group(group), Topics: []string{k.Topic("orders")}, Batch: true},
				kgo.SeedBrokers(k.Brokers...), kgo.FetchMaxWait(250*time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
		kafkaGoRate += subscribeRate(b, pool, n, fmt.Sprint("kafkago-", i), func(c *consumer.Consumer, group string) idemq.Service {
			s, err := idemqkafka.NewSubscriber(c, idemqkafka.SubscriberConfig{Brokers: k.Brokers, GroupID: k.Group(group), Topics: []string{k.Topic("orders")},
				Batch: true, MaxWait: 250 * time.Millisecond, HeartbeatInterval: 250 * time.Millisecond, SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			return s
		})
	}
	runs := float64(b.N)
	b.ReportMetric(franzRate/runs, "franz-msgs/s")
	b.ReportMetric(kafkaGoRate/runs, "kafka-go-msgs/s")
	b.ReportMetric(franzRate/kafkaGoRate, "ratio")
}

func benchPool(b *testing.B) *pgxpool.Pool {
	pool := benchOutboxPool(b)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool
}

// subscribeRate consumes the whole topic with a fresh group and scope and
// returns messages/s from Run's start to the last message settled.
func subscribeRate(b *testing.B, pool *pgxpool.Pool, n int, scope string, newSub func(*consumer.Consumer, string) idemq.Service) float64 {
	var settled atomic.Int64
	c, err := consumer.New(pool, scope, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, payload) VALUES ($1, $2)`, msg.ID, msg.Payload)
		return err
	}, consumer.Config{Hooks: consumer.Hooks{OnResult: func(consumer.ResultEvent) { settled.Add(1) }}})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	sub, err := idemq.Start(context.Background(), newSub(c, scope))
	if err != nil {
		b.Fatal(err)
	}
	for settled.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	if err := sub.Stop(); err != nil {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

// BenchmarkRelayToKafka compares, in one run, the whole outbound path
// (outbox, relay with two workers and batches of 500, sink) with the
// TxSink and with the plain franz-go Sink: 20,000 messages over 64 keys,
// so a batch is a transaction per outbox partition of its rows. The
// TxSink's time includes the relay's watermark reads when its workers
// take their partitions.
func BenchmarkRelayToKafka(b *testing.B) {
	const n = 20_000
	k := testenv.Kafka(b, 4, "tx", "franz")
	var txRate, franzRate float64
	for b.Loop() {
		txRate += relaytest.RelayThroughput(b, benchOutboxPool(b), newTxSink(b, k, franz.TxConfig{}), relaytest.OutboxMessages(n, k.Topic("tx")), 500)
		franzRate += relaytest.RelayThroughput(b, benchOutboxPool(b), newSink(b, k), relaytest.OutboxMessages(n, k.Topic("franz")), 500)
	}
	runs := float64(b.N)
	b.ReportMetric(txRate/runs, "tx-msgs/s")
	b.ReportMetric(franzRate/runs, "franz-msgs/s")
	b.ReportMetric(txRate/franzRate, "tx-ratio")
}

func benchOutboxPool(b *testing.B) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}
