package nats_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
)

const benchBatch = 100

func benchEnv(b *testing.B) *env {
	n := testenv.NATS(b)
	nc, err := n.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second), jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	e := &env{n: n, nc: nc, js: js, subject: n.Name("orders")}
	if e.stream, err = n.CreateStream(context.Background(), js, jetstream.StreamConfig{Name: n.Name("ORDERS"), Subjects: []string{e.subject}}); err != nil {
		b.Fatal(err)
	}
	return e
}

func benchMessages(e *env, n int) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		out[i] = relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: e.subject, Key: fmt.Sprint("c-", i%64),
			Payload: fmt.Appendf(nil, `{"order":%d,"amount":"10.00"}`, i), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
	}
	return out
}

func benchPool(b *testing.B) *pgxpool.Pool {
	pool := testenv.Postgres(b)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool
}

func newBenchConsumer(b *testing.B, pool *pgxpool.Pool, scope string, settled *atomic.Int64) *consumer.Consumer {
	c, err := consumer.New(pool, scope, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, payload) VALUES ($1, $2)`, msg.ID, msg.Payload)
		return err
	}, consumer.Config{Hooks: consumer.Hooks{OnResult: func(r consumer.ResultEvent) {
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

func benchDurable(b *testing.B, e *env, name string) jetstream.Consumer {
	cons, err := e.stream.CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1,
	})
	if err != nil {
		b.Fatal(err)
	}
	return cons
}

// subscribeAll consumes the whole stream with a fresh durable and scope
// and returns messages/s from Run's start to the last message settled.
func subscribeAll(b *testing.B, e *env, pool *pgxpool.Pool, n int, batch bool, iter string) float64 {
	var settled atomic.Int64
	c := newBenchConsumer(b, pool, "sub-"+iter, &settled)
	s, err := idemqnats.NewJetStreamSubscriber(c, benchDurable(b, e, "sub-"+iter), e.js,
		idemqnats.JetStreamSubscriberConfig{Batch: batch, MaxBatch: benchBatch})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	sub, err := idemq.Start(context.Background(), s)
	if err != nil {
		b.Fatal(err)
	}
	for settled.Load() < int64(n) {
		time.Sleep(100 * time.Microsecond)
	}
	elapsed := time.Since(start)
	if err := sub.Stop(); err != nil {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

// processBatchAlone applies the same messages, already in memory, with
// ProcessBatch in chunks of the subscriber's fetch size.
func processBatchAlone(b *testing.B, pool *pgxpool.Pool, msgs []*consumer.Message, iter string) float64 {
	var settled atomic.Int64
	c := newBenchConsumer(b, pool, "base-"+iter, &settled)
	start := time.Now()
	for i := 0; i < len(msgs); i += benchBatch {
		c.ProcessBatch(context.Background(), msgs[i:min(i+benchBatch, len(msgs))])
	}
	return float64(len(msgs)) / time.Since(start).Seconds()
}

// bareFetchAck fetches every message with a fresh durable and acks it (the
// last of each batch confirmed, as the subscriber does), no processing.
func bareFetchAck(b *testing.B, e *env, n int, iter string) float64 {
	cons := benchDurable(b, e, "bare-"+iter)
	start := time.Now()
	got := 0
	for got < n {
		batch, err := cons.Fetch(benchBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			b.Fatal(err)
		}
		var last jetstream.Msg
		for m := range batch.Messages() {
			if last != nil {
				_ = last.Ack()
			}
			last = m
			got++
		}
		if last != nil {
			if err := last.DoubleAck(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkJetStreamSubscriberBatch: fetch + apply through the inbox in
// batch mode vs ProcessBatch alone on the same messages already in memory
// (ratio, want >= 0.8), and bare fetch + ack of the same stream.
func BenchmarkJetStreamSubscriberBatch(b *testing.B) {
	const n = 10_000
	e := benchEnv(b)
	out := benchMessages(e, n)
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if err := sink.Publish(context.Background(), 0, out); err != nil {
		b.Fatal(err)
	}
	msgs := make([]*consumer.Message, n)
	for i, m := range out {
		id := m.ID.String()
		msgs[i] = &consumer.Message{ID: id, Payload: m.Payload, Delivery: 1,
			Headers: map[string]string{jetstream.MsgIDHeader: id, idemqnats.HeaderKey: m.Key, "traceparent": m.Headers["traceparent"]}}
	}
	pool := benchPool(b)
	var sub, base, bare float64
	for i := 0; b.Loop(); i++ {
		iter := fmt.Sprint(i)
		base += processBatchAlone(b, pool, msgs, iter)
		sub += subscribeAll(b, e, pool, n, true, iter)
		bare += bareFetchAck(b, e, n, iter)
	}
	runs := float64(b.N)
	b.ReportMetric(sub/runs, "msgs/s")
	b.ReportMetric(base/runs, "processbatch-msgs/s")
	b.ReportMetric(bare/runs, "bare-fetch-ack-msgs/s")
	b.ReportMetric(sub/base, "ratio")
}

// BenchmarkJetStreamSubscriberPerMessage: per-message mode (a transaction
// and a confirmed ack per message) vs batch mode; ratio = per-message /
// batch.
func BenchmarkJetStreamSubscriberPerMessage(b *testing.B) {
	const n = 3_000
	e := benchEnv(b)
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if err := sink.Publish(context.Background(), 0, benchMessages(e, n)); err != nil {
		b.Fatal(err)
	}
	pool := benchPool(b)
	var per, batch float64
	for i := 0; b.Loop(); i++ {
		per += subscribeAll(b, e, pool, n, false, fmt.Sprint("p", i))
		batch += subscribeAll(b, e, pool, n, true, fmt.Sprint("b", i))
	}
	runs := float64(b.N)
	b.ReportMetric(per/runs, "msgs/s")
	b.ReportMetric(batch/runs, "batch-msgs/s")
	b.ReportMetric(per/batch, "ratio")
}

// BenchmarkJetStreamSink: the relay Sink vs bare PublishMsgAsync of the
// same messages with the same bound on acks in flight (ratio = sink /
// bare, want >= 0.5), and synchronous publish for reference.
func BenchmarkJetStreamSink(b *testing.B) {
	const n, batchSize, inFlight, syncN = 20_000, 1_000, 256, 2_000
	e := benchEnv(b)
	ctx := context.Background()
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{MaxInFlight: inFlight})
	if err != nil {
		b.Fatal(err)
	}
	var viaSink, bare, sync float64
	for b.Loop() {
		out := benchMessages(e, n) // fresh ids: nothing is a duplicate
		start := time.Now()
		for i := 0; i < n; i += batchSize {
			if err := sink.Publish(ctx, 0, out[i:i+batchSize]); err != nil {
				b.Fatal(err)
			}
		}
		viaSink += n / time.Since(start).Seconds()

		out = benchMessages(e, n)
		start = time.Now()
		bareAsync(b, e.js, out, inFlight)
		bare += n / time.Since(start).Seconds()

		out = benchMessages(e, syncN)
		start = time.Now()
		for i := range out {
			if _, err := e.js.PublishMsg(ctx, rawMsg(&out[i])); err != nil {
				b.Fatal(err)
			}
		}
		sync += syncN / time.Since(start).Seconds()
	}
	runs := float64(b.N)
	b.ReportMetric(viaSink/runs, "msgs/s")
	b.ReportMetric(bare/runs, "bare-async-msgs/s")
	b.ReportMetric(sync/runs, "sync-publish-msgs/s")
	b.ReportMetric(viaSink/bare, "ratio")
}

func rawMsg(m *relay.Message) *nats.Msg {
	out := nats.NewMsg(m.Destination)
	out.Data = m.Payload
	for k, v := range m.Headers {
		out.Header.Set(k, v)
	}
	out.Header.Set(idemqnats.HeaderKey, m.Key)
	out.Header.Set(jetstream.MsgIDHeader, m.ID.String())
	return out
}

// BenchmarkRelayToJetStream: the whole outbound path, outbox rows claimed,
// published through the JetStream Sink and deleted by the relay, vs bare
// PublishMsgAsync of the same messages with the same bound on acks in
// flight (ratio = relay / bare). Postgres, not the Sink, bounds the relay;
// BenchmarkJetStreamSink isolates the Sink.
func BenchmarkRelayToJetStream(b *testing.B) {
	const n, batchSize, inFlight = 10_000, 500, 256
	e := benchEnv(b)
	pool := benchPool(b)
	sink, err := idemqnats.NewJetStreamSink(e.js, idemqnats.SinkConfig{MaxInFlight: inFlight})
	if err != nil {
		b.Fatal(err)
	}
	var viaRelay, bare float64
	for b.Loop() {
		viaRelay += relaytest.RelayThroughput(b, pool, sink, relaytest.OutboxMessages(n, e.subject), batchSize)

		raw := benchMessages(e, n)
		start := time.Now()
		bareAsync(b, e.js, raw, inFlight)
		bare += n / time.Since(start).Seconds()
	}
	runs := float64(b.N)
	b.ReportMetric(viaRelay/runs, "msgs/s")
	b.ReportMetric(bare/runs, "bare-async-msgs/s")
	b.ReportMetric(viaRelay/bare, "ratio")
}

// bareAsync publishes msgs with PublishMsgAsync, at most inFlight awaiting
// their acknowledgement.
func bareAsync(b *testing.B, js jetstream.JetStream, msgs []relay.Message, inFlight int) {
	window := make([]jetstream.PubAckFuture, 0, inFlight)
	wait := func(f jetstream.PubAckFuture) {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatal(err)
		}
	}
	for i := range msgs {
		if len(window) == inFlight {
			wait(window[0])
			window = window[1:]
		}
		f, err := js.PublishMsgAsync(rawMsg(&msgs[i]))
		if err != nil {
			b.Fatal(err)
		}
		window = append(window, f)
	}
	for _, f := range window {
		wait(f)
	}
}
