package kafka_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
)

const benchPartitions = 4

// benchTopic fills a topic with n messages carrying an id header and
// returns them per partition, in offset order, as the consumer sees them,
// for the in-memory baseline.
func benchTopic(b *testing.B, n int) (*testenv.KafkaCluster, [][]*consumer.Message) {
	k := testenv.Kafka(b, benchPartitions, "orders")
	ctx := context.Background()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		id := uuid.Must(uuid.NewV7()).String()
		payload := fmt.Appendf(nil, `{"order":%d,"amount":"10.00"}`, i)
		msgs[i] = kafka.Message{Topic: k.Topic("orders"), Key: fmt.Appendf(nil, "c-%d", i%64), Value: payload,
			Headers: []kafka.Header{{Key: idemqkafka.IDHeaderDefault, Value: []byte(id)}}}
	}
	for i := 0; i < n; i += 5000 {
		if err := k.Produce(ctx, msgs[i:min(i+5000, n)]...); err != nil {
			b.Fatal(err)
		}
	}
	stored, err := k.ReadAll(ctx, k.Topic("orders"))
	if err != nil {
		b.Fatal(err)
	}
	parts := make([][]*consumer.Message, benchPartitions)
	for _, m := range stored {
		id := string(m.Headers[0].Value)
		parts[m.Partition] = append(parts[m.Partition], &consumer.Message{ID: id, Payload: m.Value,
			Headers: map[string]string{idemqkafka.IDHeaderDefault: id}, Source: m})
	}
	return k, parts
}

func benchPool(b *testing.B) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 2 * benchPartitions
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool
}

func insertOrder(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO orders (id, payload) VALUES ($1, $2)`, msg.ID, msg.Payload)
	return err
}

// newBenchConsumer returns a migrated consumer of a fresh scope that
// counts settled messages.
func newBenchConsumer(b *testing.B, pool *pgxpool.Pool, scope string, settled *atomic.Int64) *consumer.Consumer {
	c, err := consumer.New(pool, scope, insertOrder, consumer.Config{Hooks: consumer.Hooks{OnResult: func(r consumer.ResultEvent) {
		if r.Outcome != consumer.Applied {
			b.Errorf("outcome %v: %v", r.Outcome, r.Err)
		}
		settled.Add(1)
	}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return c
}

// subscribe consumes the whole topic with a fresh group and scope and
// returns messages/s from Run's start to the last message settled.
func subscribe(b *testing.B, k *testenv.KafkaCluster, pool *pgxpool.Pool, n int, batch bool, iter string) float64 {
	var settled atomic.Int64
	c := newBenchConsumer(b, pool, "sub-"+iter, &settled)
	cfg := subscriberConfig(k, k.Group("bench-"+iter))
	cfg.Batch = batch
	s, err := idemqkafka.NewSubscriber(c, cfg)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	sub, err := idemq.Start(context.Background(), s)
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

// processBatchAlone applies each partition's messages with ProcessBatch
// from one goroutine per partition in chunks of MaxBatch (100), the work
// the Subscriber hands over.
func processBatchAlone(b *testing.B, pool *pgxpool.Pool, parts [][]*consumer.Message, iter string) float64 {
	var settled atomic.Int64
	c := newBenchConsumer(b, pool, "base-"+iter, &settled)
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, part := range parts {
		wg.Go(func() {
			for i := 0; i < len(part); i += 100 {
				c.ProcessBatch(context.Background(), part[i:min(i+100, len(part))])
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

// bareConsume reads every partition to its end with kafka-go Readers, no
// processing.
func bareConsume(b *testing.B, k *testenv.KafkaCluster, n int) float64 {
	ends := make([]int64, benchPartitions)
	for p := range ends {
		conn, err := kafka.DialLeader(context.Background(), "tcp", k.Brokers[0], k.Topic("orders"), p)
		if err != nil {
			b.Fatal(err)
		}
		ends[p], err = conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	var read atomic.Int64
	for p := range benchPartitions {
		if ends[p] == 0 {
			continue
		}
		wg.Go(func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: k.Topic("orders"), Partition: p,
				MaxBytes: 10 << 20, MaxWait: 250 * time.Millisecond, ReadLagInterval: -1, QueueCapacity: 200})
			defer r.Close()
			for {
				m, err := r.FetchMessage(context.Background())
				if err != nil {
					b.Error(err)
					return
				}
				read.Add(1)
				if m.Offset >= ends[p]-1 {
					return
				}
			}
		})
	}
	wg.Wait()
	if read.Load() != int64(n) {
		b.Fatalf("bare consumer read %d messages, want %d", read.Load(), n)
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkSubscriberBatch: consume + apply through the inbox in batch
// mode vs ProcessBatch alone on the same messages already in memory
// (ratio, want >= 0.8), and bare kafka-go consumption of the same topic.
func BenchmarkSubscriberBatch(b *testing.B) {
	const n = 10_000
	k, msgs := benchTopic(b, n)
	pool := benchPool(b)
	var sub, base, bare float64
	for i := 0; b.Loop(); i++ {
		iter := fmt.Sprint(i)
		base += processBatchAlone(b, pool, msgs, iter)
		sub += subscribe(b, k, pool, n, true, iter)
		bare += bareConsume(b, k, n)
	}
	runs := float64(b.N)
	b.ReportMetric(sub/runs, "msgs/s")
	b.ReportMetric(base/runs, "processbatch-msgs/s")
	b.ReportMetric(bare/runs, "bare-kafka-go-msgs/s")
	b.ReportMetric(sub/base, "ratio")
}

// BenchmarkSubscriberPerMessage: per-message mode (a transaction per
// message) vs batch mode on the same topic; ratio = per-message / batch.
func BenchmarkSubscriberPerMessage(b *testing.B) {
	const n = 5_000
	k, _ := benchTopic(b, n)
	pool := benchPool(b)
	var per, batch float64
	for i := 0; b.Loop(); i++ {
		per += subscribe(b, k, pool, n, false, fmt.Sprint("p", i))
		batch += subscribe(b, k, pool, n, true, fmt.Sprint("b", i))
	}
	runs := float64(b.N)
	b.ReportMetric(per/runs, "msgs/s")
	b.ReportMetric(batch/runs, "batch-msgs/s")
	b.ReportMetric(per/batch, "ratio")
}

// BenchmarkSink: the relay Sink vs a bare batched kafka.Writer writing the
// same messages in the same batches (ratio = sink / bare, want >= 0.5).
func BenchmarkSink(b *testing.B) {
	const n, batchSize = 20_000, 1_000
	k := testenv.Kafka(b, benchPartitions, "orders")
	ctx := context.Background()
	out := make([]relay.Message, n)
	raw := make([]kafka.Message, n)
	for i := range out {
		out[i] = relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: k.Topic("orders"), Key: fmt.Sprint("c-", i%64),
			Payload: fmt.Appendf(nil, `{"order":%d,"amount":"10.00"}`, i), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
		raw[i] = kafka.Message{Topic: out[i].Destination, Key: []byte(out[i].Key), Value: out[i].Payload,
			Headers: []kafka.Header{{Key: "traceparent", Value: []byte(out[i].Headers["traceparent"])}, {Key: idemqkafka.IDHeaderDefault, Value: []byte(out[i].ID.String())}}}
	}
	sinkWriter, bareWriter := idemqkafka.NewWriter(k.Brokers...), idemqkafka.NewWriter(k.Brokers...)
	defer sinkWriter.Close()
	defer bareWriter.Close()
	sink, err := idemqkafka.NewSink(sinkWriter, idemqkafka.SinkConfig{})
	if err != nil {
		b.Fatal(err)
	}
	var viaSink, bare float64
	for b.Loop() {
		start := time.Now()
		for i := 0; i < n; i += batchSize {
			if err := sink.Publish(ctx, 0, out[i:i+batchSize]); err != nil {
				b.Fatal(err)
			}
		}
		viaSink += n / time.Since(start).Seconds()
		start = time.Now()
		for i := 0; i < n; i += batchSize {
			if err := bareWriter.WriteMessages(ctx, raw[i:i+batchSize]...); err != nil {
				b.Fatal(err)
			}
		}
		bare += n / time.Since(start).Seconds()
	}
	runs := float64(b.N)
	b.ReportMetric(viaSink/runs, "msgs/s")
	b.ReportMetric(bare/runs, "bare-writer-msgs/s")
	b.ReportMetric(viaSink/bare, "ratio")
}

// BenchmarkRelayToKafka: the whole outbound path, outbox rows claimed,
// published through the Sink and deleted by the relay, vs a bare batched
// Writer on the same messages (ratio = relay / bare). Postgres, not the
// Sink, bounds the relay; BenchmarkSink isolates the Sink.
func BenchmarkRelayToKafka(b *testing.B) {
	const n, batchSize = 10_000, 500
	k := testenv.Kafka(b, benchPartitions, "orders")
	pool := benchPool(b)
	ctx := context.Background()
	w := idemqkafka.NewWriter(k.Brokers...)
	defer w.Close()
	sink, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		b.Fatal(err)
	}
	bareWriter := idemqkafka.NewWriter(k.Brokers...)
	defer bareWriter.Close()

	var viaRelay, bare float64
	for b.Loop() {
		msgs := relaytest.OutboxMessages(n, k.Topic("orders"))
		raw := make([]kafka.Message, n)
		for i, m := range msgs {
			raw[i] = kafka.Message{Topic: m.Destination, Key: []byte(m.Key), Value: m.Payload,
				Headers: []kafka.Header{{Key: idemqkafka.IDHeaderDefault, Value: []byte(m.ID.String())}}}
		}
		viaRelay += relaytest.RelayThroughput(b, pool, sink, msgs, batchSize)

		start := time.Now()
		for i := 0; i < n; i += batchSize {
			if err := bareWriter.WriteMessages(ctx, raw[i:i+batchSize]...); err != nil {
				b.Fatal(err)
			}
		}
		bare += n / time.Since(start).Seconds()
	}
	runs := float64(b.N)
	b.ReportMetric(viaRelay/runs, "msgs/s")
	b.ReportMetric(bare/runs, "bare-writer-msgs/s")
	b.ReportMetric(viaRelay/bare, "ratio")
}
