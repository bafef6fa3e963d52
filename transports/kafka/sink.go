package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/internal/outbound"
	"github.com/segmentio/kafka-go"
)

// IDHeaderDefault is the header that carries a message's idempotency key:
// the relay's outbox message id on the way out, the inbox key on the way in.
const IDHeaderDefault = "Idempotency-Key"

// SinkConfig configures a [Sink]. The zero value is ready to use.
type SinkConfig struct {
	// Topic maps an outbox destination to a Kafka topic. Defaults to the
	// destination itself. Returning "" fails that message permanently.
	Topic func(destination string) string
	// IDHeader names the header that carries the outbox message id. An
	// outbox header of the same name is overwritten. Defaults to
	// [IDHeaderDefault].
	IDHeader string
}

// Sink is a [relay.Sink] publishing outbox messages to Kafka through one
// kafka-go Writer:
//
//   - destination -> topic (through [SinkConfig.Topic]);
//   - outbox key -> message key, so the Writer's key-hashing balancer keeps
//     every message of a key in one partition, in relay order;
//   - outbox id -> the id header, other outbox headers copied;
//   - the whole batch goes out in one WriteMessages call (kafka-go groups it
//     into one produce request per partition).
//
// Per-message failures come back as a *[relay.PublishError]. Errors that a
// retry cannot fix are marked with [idemq.Permanent] so the relay
// dead-letters the row at once: a message larger than the Writer's
// BatchBytes or the broker's limit (MESSAGE_TOO_LARGE), an unknown or invalid
// topic (a wrong destination; the relay's dead letters can be replayed once
// the topic exists), an authorization failure, a record the broker rejects
// as invalid. Everything else (leader moves, timeouts, a broker that went
// away, a cancelled context) is retryable.
//
// Per-key order: the messages of one key are written in batch order to one
// partition; once one of them fails, the later ones of that key in the
// batch are not written but reported as [relay.ErrSkipped], so the relay
// retries them behind it. A key that moves to another topic within a batch
// waits for the earlier topic's write (a second WriteMessages call). The
// guarantee assumes a partition's share of a batch fits in one kafka-go
// write batch (the Writer's BatchSize and BatchBytes; [NewWriter] allows
// 10,000 messages and 16 MiB): kafka-go writes split batches one after the
// other and cannot hold back the second when the first failed.
//
// A Sink is safe for concurrent use; it does not close the Writer.
type Sink struct {
	w        *kafka.Writer
	topic    func(string) string
	idHeader string
}

// NewWriter returns a kafka-go Writer configured the way [NewSink] wants
// it: synchronous, acknowledged by all in-sync replicas, keys hashed to
// partitions with the Java client's murmur2 partitioner (so other producers
// of the same keys agree), batches of up to 10,000 messages or 16 MiB and
// partial batches flushed after a millisecond. Close it when done.
func NewWriter(brokers ...string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    10_000,
		BatchBytes:   16 << 20,
		BatchTimeout: time.Millisecond,
	}
}

// NewSink returns a Sink writing through w, which must be synchronous
// (Async false), must not fix a Topic (the Sink sets one per message), must
// wait for acknowledgements (RequiredAcks not RequireNone, kafka-go's zero
// value: a relay must not delete rows the broker never confirmed) and must
// have a Balancer that hashes keys (kafka-go's nil default is round-robin,
// which would scatter a key over partitions). [NewWriter] builds such a
// Writer. Note that kafka-go holds a partial batch for BatchTimeout
// (default one second) before sending it; keep it small.
func NewSink(w *kafka.Writer, cfg SinkConfig) (*Sink, error) {
	const c = "kafka.Sink"
	switch {
	case w == nil:
		return nil, idemq.NewConfigError(c, "Writer", "is nil")
	case w.Addr == nil:
		return nil, idemq.NewConfigError(c, "Writer.Addr", "is nil")
	case w.Async:
		return nil, idemq.NewConfigError(c, "Writer.Async", "is set, so delivery failures would be invisible to the relay")
	case w.Topic != "":
		return nil, idemq.NewConfigError(c, "Writer.Topic", "%q is set; the Sink chooses the topic from each message's destination", w.Topic)
	case w.RequiredAcks == kafka.RequireNone:
		return nil, idemq.NewConfigError(c, "Writer.RequiredAcks", "is RequireNone (the zero value); use RequireAll or RequireOne")
	case w.Balancer == nil:
		return nil, idemq.NewConfigError(c, "Writer.Balancer", "is nil (round-robin); use a key-hashing balancer such as kafka.Murmur2Balancer or kafka.Hash")
	}
	s := &Sink{w: w, topic: cfg.Topic, idHeader: cmp.Or(cfg.IDHeader, IDHeaderDefault)}
	if s.topic == nil {
		s.topic = func(d string) string { return d }
	}
	return s, nil
}

var _ relay.Sink = (*Sink)(nil)

// Publish writes batch in one WriteMessages call (one per round when keys
// move between topics). It returns nil when every message was
// acknowledged, a *[relay.PublishError] naming the failed indexes otherwise
// (also when the whole call failed, so the relay learns each message's
// classification), and ctx's error if ctx ended first.
func (s *Sink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	f := relay.NewFailures(batch)
	// Build and validate in batch order; a key's messages after an invalid
	// one are skipped.
	msgs := make([]kafka.Message, len(batch))
	limit := s.batchBytes()
	for i := range batch {
		if f.Skip(i) {
			continue
		}
		m, err := s.message(&batch[i])
		if err == nil && int64(messageSize(&m)) > limit {
			err = idemq.Permanent(fmt.Errorf("idemq/kafka: message %s is %d bytes, over the Writer's BatchBytes %d: %w",
				batch[i].ID, messageSize(&m), limit, kafka.MessageSizeTooLarge))
		}
		if err != nil {
			f.Fail(i, err)
			continue
		}
		msgs[i] = m
	}
	// Two topics are written concurrently: a key that moves to another
	// topic waits for the earlier round.
	for _, round := range relay.Rounds(batch, func(m *relay.Message) string { return s.topic(m.Destination) }) {
		var send []kafka.Message
		var index []int // send[j] is batch[index[j]]
		for _, i := range round {
			if f.Failed(i) != nil || f.Skip(i) {
				continue
			}
			send = append(send, msgs[i])
			index = append(index, i)
		}
		if len(send) > 0 {
			s.write(ctx, send, func(j int) bool { return f.Skip(index[j]) }, func(j int, err error) { f.Fail(index[j], err) })
		}
	}
	return f.Err(ctx)
}

// write sends msgs in one call and reports each failed message's
// classified error through fail. Two rare cases cost extra calls, so that
// one bad message never condemns the rest: a whole-call error about one
// topic when the batch spans several topics (retried per topic), and a
// size error shared by a multi-message produce batch (retried per message,
// skipping what skip says follows a failed message of its key).
func (s *Sink) write(ctx context.Context, msgs []kafka.Message, skip func(j int) bool, fail func(j int, err error)) {
	err := s.w.WriteMessages(ctx, msgs...)
	if err == nil {
		return
	}
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) || len(werrs) != len(msgs) {
		// The whole call failed before anything was sent (metadata,
		// closed writer, context).
		if topicError(err) && spansTopics(msgs) {
			s.perTopic(ctx, msgs, skip, fail)
			return
		}
		for j := range msgs {
			fail(j, classify(err))
		}
		return
	}
	var sizeFailures []int
	for j, e := range werrs {
		switch {
		case e == nil:
		case sizeError(e):
			sizeFailures = append(sizeFailures, j)
		default:
			fail(j, classify(e))
		}
	}
	if len(sizeFailures) == 1 {
		fail(sizeFailures[0], classify(werrs[sizeFailures[0]]))
		return
	}
	for _, j := range sizeFailures {
		if skip(j) {
			continue
		}
		if err := s.w.WriteMessages(ctx, msgs[j]); err != nil {
			fail(j, classify(unwrapSingle(err)))
		}
	}
}

func (s *Sink) perTopic(ctx context.Context, msgs []kafka.Message, skip func(int) bool, fail func(int, error)) {
	groups := make(map[string][]int)
	for j := range msgs {
		groups[msgs[j].Topic] = append(groups[msgs[j].Topic], j)
	}
	for _, idx := range groups {
		sub := make([]kafka.Message, len(idx))
		for k, j := range idx {
			sub[k] = msgs[j]
		}
		s.write(ctx, sub, func(k int) bool { return skip(idx[k]) }, func(k int, err error) { fail(idx[k], err) })
	}
}

func (s *Sink) message(m *relay.Message) (kafka.Message, error) {
	topic := s.topic(m.Destination)
	if topic == "" {
		return kafka.Message{}, idemq.Permanent(fmt.Errorf("idemq/kafka: message %s: destination %q maps to no topic: %w",
			m.ID, m.Destination, kafka.InvalidTopic))
	}
	km := kafka.Message{Topic: topic, Value: m.Payload}
	if m.Key != "" {
		km.Key = []byte(m.Key)
	}
	km.Headers = make([]kafka.Header, 0, len(m.Headers)+1)
	outbound.Headers(m, s.idHeader, func(k string, v []byte) { km.Headers = append(km.Headers, kafka.Header{Key: k, Value: v}) })
	return km, nil
}

func (s *Sink) batchBytes() int64 {
	if s.w.BatchBytes > 0 {
		return s.w.BatchBytes
	}
	return 1 << 20 // kafka-go's default
}

// messageSize is an upper bound of kafka-go's own accounting of a
// message's size (Message.totalSize, unexported).
func messageSize(m *kafka.Message) int {
	n := 4 + 1 + 1 + 4 + len(m.Key) + 4 + len(m.Value) + 8
	n += 5
	for _, h := range m.Headers {
		n += 5 + len(h.Key) + 5 + len(h.Value)
	}
	return n
}

// permanentCodes are the broker errors a retry of the same message cannot
// fix.
var permanentCodes = map[kafka.Error]bool{
	kafka.MessageSizeTooLarge:         true,
	kafka.RecordListTooLarge:          true,
	kafka.UnknownTopicOrPartition:     true,
	kafka.InvalidTopic:                true,
	kafka.TopicAuthorizationFailed:    true,
	kafka.ClusterAuthorizationFailed:  true,
	kafka.InvalidRecord:               true,
	kafka.InvalidRequiredAcks:         true,
	kafka.UnsupportedForMessageFormat: true,
	kafka.PolicyViolation:             true,
}

// classify marks err permanent when no retry can help; everything else
// stays retryable.
func classify(err error) error {
	if err == nil || idemq.IsPermanent(err) {
		return err
	}
	var code kafka.Error
	if errors.As(err, &code) && permanentCodes[code] {
		return idemq.Permanent(err)
	}
	return err
}

func topicError(err error) bool {
	var code kafka.Error
	return errors.As(err, &code) && (code == kafka.UnknownTopicOrPartition || code == kafka.InvalidTopic || code == kafka.TopicAuthorizationFailed)
}

func sizeError(err error) bool {
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge)
}

func spansTopics(msgs []kafka.Message) bool {
	for j := range msgs {
		if msgs[j].Topic != msgs[0].Topic {
			return true
		}
	}
	return false
}

func unwrapSingle(err error) error {
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == 1 && werrs[0] != nil {
		return werrs[0]
	}
	return err
}
