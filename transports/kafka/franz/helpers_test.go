package franz_test

import (
	"cmp"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// readCommitted returns every committed record of topic, read from the
// start by a plain kgo consumer (no inbox) up to the topic's last stable
// offsets at the time of the call.
func readCommitted(ctx context.Context, k *testenv.KafkaCluster, topic string) ([]*kgo.Record, error) {
	return readTopic(ctx, k, topic, kgo.ReadCommitted())
}

// readAllCommitted returns the committed records of topics, one topic
// after the other.
func readAllCommitted(t testing.TB, ctx context.Context, k *testenv.KafkaCluster, topics []string) []*kgo.Record {
	t.Helper()
	var records []*kgo.Record
	for _, topic := range topics {
		recs, err := readCommitted(ctx, k, topic)
		if err != nil {
			t.Fatal(err)
		}
		records = append(records, recs...)
	}
	return records
}

// readTopic reads topic like readCommitted, at isolation level, up to the
// end offsets of that level (control records are read to see the end,
// and left out).
func readTopic(ctx context.Context, k *testenv.KafkaCluster, topic string, level kgo.IsolationLevel) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(level), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.KeepControlRecords(), kgo.FetchMaxWait(50*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	if level == kgo.ReadCommitted() {
		req.IsolationLevel = 1
	}
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(k.Partitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	left := map[int32]int64{} // partition -> end offset not reached yet
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, err
			}
			if p.Offset > 0 {
				left[p.Partition] = p.Offset
			}
		}
	}
	var out []*kgo.Record
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset < end && !r.Attrs.IsControl() {
				out = append(out, r)
			}
			if end, ok := left[r.Partition]; ok && r.Offset >= end-1 {
				delete(left, r.Partition)
			}
		})
	}
	return out, nil
}

// newOutbox returns a pool on the database at url and its migrated
// default outbox.
func newOutbox(t testing.TB, ctx context.Context, url string) (*pgxpool.Pool, *outbox.Outbox) {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, ob
}

// receivedFn is relaytest.Target.Received on a read_committed consumer.
func receivedFn(k *testenv.KafkaCluster) func(ctx context.Context, topic string, n int) ([]relay.Message, error) {
	return func(ctx context.Context, topic string, n int) ([]relay.Message, error) {
		for {
			got, err := readCommitted(ctx, k, topic)
			if err != nil || len(got) >= n {
				return received(got), err
			}
			if err := lifecycle.Sleep(ctx, 20*time.Millisecond); err != nil {
				return received(got), err
			}
		}
	}
}

// received turns Kafka records back into the outbox messages they carry.
func received(records []*kgo.Record) []relay.Message {
	out := make([]relay.Message, len(records))
	for i, r := range records {
		m := outbox.Message{Destination: r.Topic, Key: string(r.Key), Payload: r.Value, Headers: map[string]string{}}
		for _, h := range r.Headers {
			m.Headers[h.Key] = string(h.Value)
		}
		m.ID, _ = uuid.Parse(m.Headers[franz.IDHeaderDefault])
		out[i] = relay.Message{Message: m}
	}
	return out
}

// failTopic maps the destination "fail" to no topic.
func failTopic(d string) string {
	if d == "fail" {
		return ""
	}
	return d
}

func newSink(t testing.TB, k *testenv.KafkaCluster) *franz.Sink {
	s, err := franz.NewSink(franz.SinkConfig{Topic: failTopic}, kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newTxSink(t testing.TB, k *testenv.KafkaCluster, cfg franz.TxConfig) *franz.TxSink {
	cfg.Topic = failTopic
	cfg.Outbox = cmp.Or(cfg.Outbox, "idemq-test")
	if cfg.TransactionalIDPrefix == "" {
		cfg.TransactionalIDPrefix = "idemq-test-" + uuid.NewString()[:8] + "-"
	}
	if cfg.WatermarkTopic == "" {
		cfg.WatermarkTopic = "idemq-watermarks-" + uuid.NewString()[:8] // created by the TxSink
	}
	s, err := franz.NewTxSink(cfg, kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// quiet is a logger that discards everything.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }
