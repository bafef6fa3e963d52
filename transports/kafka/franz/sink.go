package franz

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/internal/outbound"
)

// IDHeaderDefault is the header that carries a message's idempotency key,
// the same as package transports/kafka's: the relay's outbox message id on
// the way out, the inbox key on the way in.
const IDHeaderDefault = "Idempotency-Key"

// MaxRecordBytesDefault is the default [SinkConfig.MaxRecordBytes]: a
// little under the broker's default message.max.bytes (1 MiB).
const MaxRecordBytesDefault = 1_000_000

// recordOverhead bounds the bytes of a record's framing and of a batch
// header around a single record.
const recordOverhead = 128

// SinkConfig configures a [Sink] or a [TxSink]. The zero value is ready to
// use for a Sink.
type SinkConfig struct {
	// Topic maps an outbox destination to a Kafka topic. Defaults to the
	// destination itself. Returning "" fails that message permanently.
	Topic func(destination string) string
	// IDHeader names the header that carries the outbox message id. An
	// outbox header of the same name is overwritten. Defaults to
	// [IDHeaderDefault].
	IDHeader string
	// MaxRecordBytes is the largest record (key, value and headers) the
	// Sink sends; a larger message fails permanently (a dead letter)
	// before anything of its batch is sent, so it never breaks a key's
	// order or aborts a transaction. Keep it at or below the topics'
	// max.message.bytes. Defaults to [MaxRecordBytesDefault].
	MaxRecordBytes int

	manualTopic string // a TxSink's watermark topic
}

// partitioner hashes keys with murmur2 (kgo's StickyKeyPartitioner), and
// leaves the records of the manual topic (a TxSink's watermark topic) in
// the partition they name.
type partitioner struct{ manual string }

// ForTopic implements kgo.Partitioner.
func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic != "" && topic == p.manual {
		return kgo.ManualPartitioner().ForTopic(topic)
	}
	return kgo.StickyKeyPartitioner(nil).ForTopic(topic)
}

func (c SinkConfig) withDefaults() SinkConfig {
	c.IDHeader = cmp.Or(c.IDHeader, IDHeaderDefault)
	c.MaxRecordBytes = cmp.Or(c.MaxRecordBytes, MaxRecordBytesDefault)
	if c.Topic == nil {
		c.Topic = func(d string) string { return d }
	}
	return c
}

func (c SinkConfig) validate(component string) error {
	if c.MaxRecordBytes < 0 {
		return idemq.NewConfigError(component, "MaxRecordBytes", "%d is negative", c.MaxRecordBytes)
	}
	return nil
}

// producerOpts are the options every client of a Sink gets after the
// user's: acknowledged by all in-sync replicas, idempotent (kgo's default,
// never disabled), keys hashed with the Java client's murmur2 partitioner
// (so kafka-go's Murmur2Balancer and other producers of the same keys
// agree), batches large enough for MaxRecordBytes.
func producerOpts(cfg SinkConfig) []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(partitioner{manual: cfg.manualTopic}),
		kgo.ProducerBatchMaxBytes(int32(cfg.MaxRecordBytes + recordOverhead)),
		kgo.ProducerLinger(time.Second), // Publish flushes
	}
}

// Sink is a [relay.Sink] publishing outbox messages to Kafka through one
// idempotent franz-go (kgo) client:
//
//   - destination -> topic (through [SinkConfig.Topic]);
//   - outbox key -> record key, hashed with murmur2 to a partition, so
//     every message of a key lands in one partition in relay order;
//   - outbox id -> the id header, other outbox headers copied.
//
// The producer is idempotent: a produce request kgo retries after a lost
// response is written once, and records of a partition are never
// reordered. A relay crash between publish and delete still publishes the
// row again (with the same id header, which a receiving inbox drops); for
// no duplicates at all use a [TxSink].
//
// Per-message failures come back as a *[relay.PublishError]. Errors no
// retry can fix (a record over MaxRecordBytes or the broker's limit, a
// destination that maps to no topic, an unknown or invalid topic, an
// authorization failure, an invalid record) are marked with
// [idemq.Permanent]; the rest (leader moves, timeouts, a broker that went
// away, a cancelled context) are retryable. Once a message of a key
// failed, the later ones of that key in the batch are reported as
// [relay.ErrSkipped]: the Sink checks every record before producing any
// (so a message that cannot go never breaks its key's order), produces a
// key that moves between topics in a later round, and the idempotent
// producer writes a partition's records in order, retrying in place. Like
// the kafka-go Sink, it cannot take back a later record of a key that the
// broker accepted after refusing an earlier one for good (a non-retriable
// error on one produce request of a partition and success on the next).
//
// A Sink is safe for concurrent use. Close closes its client.
type Sink struct {
	cl  *kgo.Client
	cfg SinkConfig
}

// NewSink returns a Sink on a new kgo client made of opts (at least
// kgo.SeedBrokers; TLS, SASL, client id as needed) and the producer
// options the Sink needs, which come last and win (among them a linger of
// a second: Publish flushes a batch's records at once). It does not
// contact the brokers.
func NewSink(cfg SinkConfig, opts ...kgo.Opt) (*Sink, error) {
	const c = "franz.Sink"
	cfg = cfg.withDefaults()
	if err := cfg.validate(c); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), producerOpts(cfg)...)...)
	if err != nil {
		return nil, idemq.NewConfigError(c, "opts", "kgo refuses them: %v", err)
	}
	return &Sink{cl: cl, cfg: cfg}, nil
}

var _ relay.Sink = (*Sink)(nil)

// Client returns the Sink's kgo client, for metrics and admin requests.
func (s *Sink) Client() *kgo.Client { return s.cl }

// Close closes the client.
func (s *Sink) Close() { s.cl.Close() }

// Publish produces batch and waits for every record's acknowledgement. It
// returns nil when every message was acknowledged, a *[relay.PublishError]
// naming the failed indexes otherwise, and ctx's error if ctx ended first
// with nothing delivered.
func (s *Sink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	f := relay.NewFailures(batch)
	recs := buildRecords(s.cfg, batch, f)
	for _, round := range relay.Rounds(batch, func(m *relay.Message) string { return s.cfg.Topic(m.Destination) }) {
		var send []int
		for _, i := range round {
			if recs[i] != nil && f.Failed(i) == nil && !f.Skip(i) {
				send = append(send, i)
			}
		}
		for i, err := range produce(ctx, s.cl, recs, send) {
			f.Fail(i, err)
		}
	}
	return f.Err(ctx)
}

// produce sends recs[i] for i in send and waits for them; it returns the
// classified error of each failed index.
func produce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, send []int) map[int]error {
	if len(send) == 0 {
		return nil
	}
	rs := make([]*kgo.Record, len(send))
	for j, i := range send {
		rs[j] = recs[i]
	}
	var failed map[int]error
	for j, err := range produceAll(ctx, cl, rs, false) {
		if err != nil {
			if failed == nil {
				failed = map[int]error{}
			}
			failed[send[j]] = err
		}
	}
	return failed
}

// produceAll sends rs and waits for them; it returns each record's
// classified error. The clients linger, so the records go out together
// when it flushes. A client of its own (a TxSink partition's) drops what
// it still buffers when ctx ends before the flush; on a shared client
// those records go out when the linger ends, within a second.
func produceAll(ctx context.Context, cl *kgo.Client, rs []*kgo.Record, own bool) []error {
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	wg.Add(len(rs))
	for j, r := range rs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			errs[j] = classify(err)
			wg.Done()
		})
	}
	// Send what lingers; the promises report the outcome.
	if err := cl.Flush(ctx); err != nil && own {
		_ = cl.AbortBufferedRecords(context.WithoutCancel(ctx))
	}
	wg.Wait()
	return errs
}

// buildRecords turns the batch into records, failing (permanently) the
// messages that map to no topic or are too large, before anything is
// sent; the later messages of their keys are skipped.
func buildRecords(cfg SinkConfig, batch []relay.Message, f *relay.Failures) []*kgo.Record {
	recs := make([]*kgo.Record, len(batch))
	for i := range batch {
		if f.Skip(i) {
			continue
		}
		r, err := record(cfg, &batch[i])
		if err != nil {
			f.Fail(i, err)
			continue
		}
		recs[i] = r
	}
	return recs
}

// record builds the record of m.
func record(cfg SinkConfig, m *relay.Message) (*kgo.Record, error) {
	topic := cfg.Topic(m.Destination)
	switch {
	case topic == "":
		return nil, idemq.Permanent(fmt.Errorf("idemq/franz: message %s: destination %q maps to no topic: %w",
			m.ID, m.Destination, kerr.InvalidTopicException))
	case topic == cfg.manualTopic:
		return nil, idemq.Permanent(fmt.Errorf("idemq/franz: message %s: destination %q maps to the watermark topic %s: %w",
			m.ID, m.Destination, topic, kerr.InvalidTopicException))
	}
	if p := topicProblem(topic); p != "" {
		return nil, idemq.Permanent(fmt.Errorf("idemq/franz: message %s: destination %q maps to topic %s: %w",
			m.ID, m.Destination, p, kerr.InvalidTopicException))
	}
	r := &kgo.Record{Topic: topic, Value: m.Payload}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	r.Headers = make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	outbound.Headers(m, cfg.IDHeader, func(k string, v []byte) { r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: v}) })
	if n := recordSize(r); n > cfg.MaxRecordBytes {
		return nil, idemq.Permanent(fmt.Errorf("idemq/franz: message %s is %d bytes, over MaxRecordBytes %d: %w",
			m.ID, n, cfg.MaxRecordBytes, kerr.MessageTooLarge))
	}
	return r, nil
}

// recordSize is an upper bound of a record's encoded size, without the
// batch around it.
func recordSize(r *kgo.Record) int {
	n := 21 + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// permanent are the broker errors a retry of the same message cannot fix.
var permanent = []*kerr.Error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.UnknownTopicOrPartition,
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.ClusterAuthorizationFailed,
	kerr.TransactionalIDAuthorizationFailed,
	kerr.InvalidRecord,
	kerr.PolicyViolation,
}

// classify marks err permanent when no retry can help.
func classify(err error) error {
	if err == nil || idemq.IsPermanent(err) {
		return err
	}
	for _, p := range permanent {
		if errors.Is(err, p) {
			return idemq.Permanent(err)
		}
	}
	return err
}
