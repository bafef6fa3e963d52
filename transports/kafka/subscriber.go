package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/retry"
	"github.com/segmentio/kafka-go"
)

// Dead-letter headers the [Subscriber] adds to a message it publishes to
// [SubscriberConfig.DeadLetterTopic].
const (
	// HeaderDeadLetterReason carries the error that made the message a
	// dead letter or a conflict.
	HeaderDeadLetterReason = "Idemq-Dead-Letter-Reason"
	// HeaderDeadLetterOutcome is "dead-lettered" or "conflict".
	HeaderDeadLetterOutcome = "Idemq-Dead-Letter-Outcome"
	// HeaderDeadLetterSource is the original topic/partition/offset.
	HeaderDeadLetterSource = "Idemq-Dead-Letter-Source"
)

// ErrConfig is returned (wrapped) by [NewSubscriber] for an invalid
// configuration.
var ErrConfig = errors.New("idemq/kafka: invalid configuration")

// errNotAttempted marks the messages after a retried one in per-message
// mode: they were not processed and are re-read after it.
var errNotAttempted = errors.New("idemq/kafka: an earlier message of the partition is retried")

// ErrCrash is returned (wrapped) by [Subscriber.Run] when a
// [SubscriberConfig.BeforeCommit] hook vetoed a commit.
var ErrCrash = errors.New("idemq/kafka: commit vetoed by BeforeCommit")

// SubscriberConfig configures a [Subscriber]. Zero fields take the
// documented defaults.
type SubscriberConfig struct {
	// Brokers are the bootstrap addresses. Required.
	Brokers []string
	// GroupID is the Kafka consumer group. Required. It is independent of
	// the consumer's dedupe scope; usually both name the same service.
	GroupID string
	// Topics are the topics to consume. Required.
	Topics []string

	// IDHeader names the header holding the message id. Defaults to
	// [DefaultIDHeader] ("Idempotency-Key"). A message without it gets the
	// id "topic/partition/offset", stable across redeliveries of that one
	// record but different for a producer's re-send: such producers should
	// set the header (or the consumer derive its key from the payload).
	IDHeader string
	// FallbackOnInvalidID gives a message whose id header is present but
	// unusable as a key (inbox.Store.Validate rejects it: empty, over the
	// key limit, not valid UTF-8, with NUL) the
	// topic/partition/offset id instead, and processes it. Defaults to
	// false: the header is passed through unchanged and the consumer
	// dead-letters the message with consumer.ErrInvalidMessage (published to
	// DeadLetterTopic if set), so a producer bug is seen rather than
	// half-deduplicated. Either way the partition moves on. A consumer whose
	// KeyFunc derives the key from the payload is not affected.
	FallbackOnInvalidID bool

	// Batch applies what was fetched for a partition with
	// consumer.ProcessBatch (one transaction, a savepoint per message).
	// Defaults to false: consumer.Process, one transaction per message.
	// Either way offsets are committed once per fetched group. Batch mode
	// keeps partition order for messages that succeed at their first
	// attempt; one whose handler fails is retried after its batch
	// committed, so after the later messages of that batch. Use
	// per-message mode where a failure must hold back its successors.
	Batch bool
	// MaxBatch bounds the messages taken from a partition's fetch queue at
	// once. Defaults to 100.
	MaxBatch int

	// DeadLetterTopic, if set, receives a copy of every message the consumer
	// settles as DeadLettered or Conflict (key, value and headers, plus the
	// Idemq-Dead-Letter-* headers and the id header), before its offset is
	// committed. Delivery is at least once: a crash before the commit
	// re-publishes with the same id header.
	DeadLetterTopic string
	// DeadLetterWriter writes to DeadLetterTopic. Defaults to
	// [NewWriter](Brokers...) dialling with Dialer's TLS, SASL and client
	// id, closed by Run.
	DeadLetterWriter *kafka.Writer

	// StartOffset is where a group without a committed offset starts:
	// kafka.FirstOffset (the default) or kafka.LastOffset.
	StartOffset int64
	// MaxWait bounds how long a fetch waits for data. Defaults to 1 second.
	MaxWait time.Duration
	// MaxBytes bounds a fetch response. Defaults to 10 MiB.
	MaxBytes int
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are passed to
	// the consumer group. Default to kafka-go's (30 s, 3 s, 30 s).
	SessionTimeout, HeartbeatInterval, RebalanceTimeout time.Duration
	// ShutdownTimeout bounds how long Run, once its context is cancelled,
	// lets the in-flight batch finish before cancelling it (unfinished
	// messages are then redelivered). Defaults to 30 seconds.
	ShutdownTimeout time.Duration
	// RetryBaseDelay and RetryMaxDelay shape the backoff (full jitter)
	// before a message with a Retry outcome is re-read, when the consumer
	// gave no RetryAfter, and between failed group joins. Default to 100 ms
	// and 10 s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// Dialer is used for every broker connection. Defaults to kafka-go's.
	Dialer *kafka.Dialer
	// Logger receives rebalances, commit failures and retries. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// BeforeCommit, if set, runs after a fetched group of messages was
	// processed and before its offset is committed; results[i] is the
	// outcome of msgs[i]. A non-nil error vetoes the commit and stops Run at
	// once, without committing anything more, and Run returns it wrapped in
	// [ErrCrash]: a crash between the database commit and the offset
	// commit, for tests and chaos drills.
	// msgs[i].Source is the kafka.Message.
	BeforeCommit func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error
}

func (c SubscriberConfig) withDefaults() (SubscriberConfig, error) {
	switch {
	case len(c.Brokers) == 0:
		return c, fmt.Errorf("%w: no Brokers", ErrConfig)
	case c.GroupID == "":
		return c, fmt.Errorf("%w: empty GroupID", ErrConfig)
	case len(c.Topics) == 0:
		return c, fmt.Errorf("%w: no Topics", ErrConfig)
	case c.MaxBatch < 0 || c.MaxWait < 0 || c.MaxBytes < 0 || c.ShutdownTimeout < 0 || c.RetryBaseDelay < 0 || c.RetryMaxDelay < 0:
		return c, fmt.Errorf("%w: negative size or duration", ErrConfig)
	case c.StartOffset != 0 && c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return c, fmt.Errorf("%w: StartOffset must be kafka.FirstOffset or kafka.LastOffset", ErrConfig)
	}
	for _, t := range c.Topics {
		if t == "" || t == c.DeadLetterTopic {
			return c, fmt.Errorf("%w: topic %q is empty or the dead-letter topic", ErrConfig, t)
		}
	}
	if c.IDHeader == "" {
		c.IDHeader = DefaultIDHeader
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 100
	}
	if c.StartOffset == 0 {
		c.StartOffset = kafka.FirstOffset
	}
	if c.MaxWait == 0 {
		c.MaxWait = time.Second
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 10 << 20
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.RetryBaseDelay == 0 {
		c.RetryBaseDelay = 100 * time.Millisecond
	}
	if c.RetryMaxDelay == 0 {
		c.RetryMaxDelay = 10 * time.Second
	}
	if c.RetryBaseDelay > c.RetryMaxDelay {
		return c, fmt.Errorf("%w: RetryBaseDelay exceeds RetryMaxDelay", ErrConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Subscriber consumes Kafka topics as a member of a consumer group and
// applies every message through a consumer.Consumer, effectively once.
//
// Each assigned partition is read by its own goroutine, in offset order. A
// fetched group of messages is processed (one transaction per message, or
// one per group in Batch mode) and then its offset is committed: only
// after the transaction committed or the message was recognised as a
// duplicate, a conflict or a dead letter (consumer.Result.Settled). A Retry
// outcome is never skipped: the offsets before it are committed, and the
// partition is re-read from the retried message after its RetryAfter (or a
// backoff). A crash anywhere between the database commit and the offset
// commit means a redelivery that the inbox recognises as a Duplicate.
//
// A rebalance lets each revoked partition finish and commit its in-flight
// group before the member rejoins; whatever did not commit is redelivered
// to the partition's next owner and deduplicated there.
//
// Message.Delivery is 1 on the first delivery of a record to this process
// and counts up each time a Retry makes the Subscriber re-read it, so a
// consumer with Config.Redeliver counts its attempts (Kafka keeps no
// delivery count across processes: after a restart it starts at 1 again).
//
// The handler sees the Kafka record: Message.Headers holds its headers
// (the last value wins for a repeated name), Message.Source is the
// kafka.Message with key, topic, partition, offset and time; see [Record].
type Subscriber struct {
	c      *consumer.Consumer
	cfg    SubscriberConfig
	policy retry.Policy
	log    *slog.Logger

	dlq     *kafka.Writer
	ownsDLQ bool

	crashMu sync.Mutex
	crash   error
}

// NewSubscriber returns a Subscriber applying messages through c. It
// validates cfg; it does not contact the brokers (Run does).
func NewSubscriber(c *consumer.Consumer, cfg SubscriberConfig) (*Subscriber, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: nil consumer", ErrConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		c:      c,
		cfg:    cfg,
		policy: retry.Policy{Base: cfg.RetryBaseDelay, Cap: cfg.RetryMaxDelay},
		log:    cfg.Logger.With(slog.String("group", cfg.GroupID), slog.String("scope", c.Scope())),
	}
	if cfg.DeadLetterTopic != "" {
		s.dlq = cfg.DeadLetterWriter
		if s.dlq == nil {
			s.dlq = NewWriter(cfg.Brokers...)
			// Its own transport, so that Run can close its connections,
			// dialling like the consumer does.
			t := &kafka.Transport{}
			if d := cfg.Dialer; d != nil {
				t.TLS, t.SASL, t.ClientID = d.TLS, d.SASLMechanism, d.ClientID
				if d.DialFunc != nil {
					t.Dial = d.DialFunc
				}
			}
			s.dlq.Transport = t
			s.ownsDLQ = true
		}
	}
	return s, nil
}

// Record returns the Kafka record a message came from, for handlers that
// need its key, topic, partition, offset or time.
func Record(msg *consumer.Message) (kafka.Message, bool) {
	if msg == nil {
		return kafka.Message{}, false
	}
	m, ok := msg.Source.(kafka.Message)
	return m, ok
}

// FallbackID is the id of a record without an id header:
// "topic/partition/offset".
func FallbackID(m kafka.Message) string {
	return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10)
}

// Run joins the group and consumes until ctx is cancelled, then finishes
// the in-flight groups (up to ShutdownTimeout), commits them, leaves the
// group and returns nil. It returns an error only for a BeforeCommit veto
// ([ErrCrash]); broker and database failures are logged and retried. Run
// may be called once.
func (s *Subscriber) Run(ctx context.Context) error {
	if s.ownsDLQ {
		defer func() {
			_ = s.dlq.Close()
			s.dlq.Transport.(*kafka.Transport).CloseIdleConnections()
		}()
	}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                s.cfg.GroupID,
		Brokers:           s.cfg.Brokers,
		Dialer:            s.cfg.Dialer,
		Topics:            s.cfg.Topics,
		StartOffset:       s.cfg.StartOffset,
		SessionTimeout:    s.cfg.SessionTimeout,
		HeartbeatInterval: s.cfg.HeartbeatInterval,
		RebalanceTimeout:  s.cfg.RebalanceTimeout,
		ErrorLogger:       kafka.LoggerFunc(func(f string, a ...any) { s.log.Debug(fmt.Sprintf(f, a...)) }),
	})
	if err != nil {
		return fmt.Errorf("idemq/kafka: consumer group: %w", err)
	}

	// runCtx ends on shutdown or on a crash.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var workers sync.WaitGroup
	attempt := 0
	for runCtx.Err() == nil {
		gen, err := group.Next(runCtx)
		if err != nil {
			if runCtx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			attempt++
			s.log.WarnContext(ctx, "joining consumer group", slog.Any("error", err), slog.Int("attempt", attempt))
			_ = retry.Sleep(runCtx, s.policy.Delay(attempt))
			continue
		}
		attempt = 0
		s.log.InfoContext(ctx, "joined consumer group", slog.Int("generation", int(gen.ID)), slog.Any("assignments", assignments(gen)))
		for topic, parts := range gen.Assignments {
			for _, p := range parts {
				workers.Add(1)
				gen.Start(func(genCtx context.Context) {
					defer workers.Done()
					s.partition(runCtx, genCtx, stop, gen, topic, p.ID, p.Offset)
				})
			}
		}
	}
	// Let every partition finish and commit its in-flight group while the
	// generation is still ours, then leave the group.
	workers.Wait()
	closeErr := group.Close()
	if closeErr != nil {
		s.log.WarnContext(ctx, "leaving consumer group", slog.Any("error", closeErr))
	}
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	return s.crash
}

func assignments(gen *kafka.Generation) map[string][]int {
	out := make(map[string][]int, len(gen.Assignments))
	for t, ps := range gen.Assignments {
		for _, p := range ps {
			out[t] = append(out[t], p.ID)
		}
	}
	return out
}

// partition consumes one partition until the generation ends or runCtx is
// done, committing after every processed group.
func (s *Subscriber) partition(runCtx, genCtx context.Context, stop context.CancelFunc, gen *kafka.Generation, topic string, partition int, offset int64) {
	log := s.log.With(slog.String("topic", topic), slog.Int("partition", partition))
	// fetchCtx ends with the generation (rebalance) or the run (shutdown).
	fetchCtx, cancelFetch := context.WithCancel(runCtx)
	defer cancelFetch()
	stopAfter := context.AfterFunc(genCtx, cancelFetch)
	defer stopAfter()

	reader := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         s.cfg.Brokers,
		Dialer:          s.cfg.Dialer,
		Topic:           topic,
		Partition:       partition,
		MinBytes:        1,
		MaxBytes:        s.cfg.MaxBytes,
		MaxWait:         s.cfg.MaxWait,
		QueueCapacity:   2 * s.cfg.MaxBatch,
		ReadLagInterval: -1,
		ErrorLogger:     kafka.LoggerFunc(func(f string, a ...any) { log.Debug(fmt.Sprintf(f, a...)) }),
	})
	defer reader.Close()
	if err := reader.SetOffset(offset); err != nil {
		log.ErrorContext(runCtx, "seek", slog.Int64("offset", offset), slog.Any("error", err))
		return
	}

	retries := 0
	// redelivered counts, for offsets re-read after a Retry, how many times
	// this process delivered them before (Message.Delivery - 1).
	redelivered := map[int64]int{}
	batch := make([]kafka.Message, 0, s.cfg.MaxBatch)
	for fetchCtx.Err() == nil {
		batch = batch[:0]
		m, err := reader.FetchMessage(fetchCtx)
		if err != nil {
			if fetchCtx.Err() == nil {
				log.WarnContext(runCtx, "fetch", slog.Any("error", err))
				_ = retry.Sleep(fetchCtx, s.policy.Delay(1))
			}
			continue
		}
		batch = append(batch, m)
		// Take what the reader has already fetched, without waiting.
		for more := min(int(reader.Stats().QueueLength), s.cfg.MaxBatch-1); more > 0; more-- {
			m, err := reader.FetchMessage(fetchCtx)
			if err != nil {
				break
			}
			batch = append(batch, m)
		}

		// The in-flight group finishes even when the generation or the run
		// ends, within ShutdownTimeout.
		workCtx, cancelWork := context.WithCancel(context.WithoutCancel(runCtx))
		stopWork := context.AfterFunc(fetchCtx, func() {
			t := time.AfterFunc(s.cfg.ShutdownTimeout, cancelWork)
			context.AfterFunc(workCtx, func() { t.Stop() })
		})
		msgs, results := s.process(workCtx, batch, redelivered)
		settled := s.settle(workCtx, log, batch, results)
		stopWork()
		cancelWork()

		if settled > 0 {
			if s.cfg.BeforeCommit != nil {
				if err := s.cfg.BeforeCommit(runCtx, msgs[:settled], results[:settled]); err != nil {
					s.setCrash(err)
					stop()
					return
				}
			}
			if s.crashed() {
				return
			}
			if err := gen.CommitOffsets(map[string]map[int]int64{topic: {partition: batch[settled-1].Offset + 1}}); err != nil {
				// The work is durable; a redelivery is deduplicated.
				log.WarnContext(runCtx, "commit offset", slog.Int64("offset", batch[settled-1].Offset+1), slog.Any("error", err))
			}
		}
		if settled == len(batch) {
			retries = 0
			clear(redelivered)
			continue
		}
		for _, m := range batch[:settled] {
			delete(redelivered, m.Offset)
		}
		for j := settled; j < len(batch); j++ {
			if results[j].Outcome == consumer.Retry && !errors.Is(results[j].Err, errNotAttempted) {
				redelivered[batch[j].Offset]++
			}
		}
		// Never skip: re-read from the first unsettled message.
		retries++
		r := results[settled]
		delay := r.RetryAfter
		if delay <= 0 {
			delay = s.policy.Delay(retries)
		}
		log.WarnContext(runCtx, "message will be redelivered", slog.Int64("offset", batch[settled].Offset),
			slog.String("key", r.Key), slog.Duration("after", delay), slog.Any("error", r.Err))
		_ = retry.Sleep(fetchCtx, delay)
		if err := reader.SetOffset(batch[settled].Offset); err != nil {
			log.ErrorContext(runCtx, "seek back", slog.Any("error", err))
			return
		}
	}
}

// process applies batch through the consumer.
func (s *Subscriber) process(ctx context.Context, batch []kafka.Message, redelivered map[int64]int) ([]*consumer.Message, []consumer.Result) {
	msgs := make([]*consumer.Message, len(batch))
	for i := range batch {
		msgs[i] = s.message(batch[i])
		msgs[i].Delivery = 1 + redelivered[batch[i].Offset]
	}
	if s.cfg.Batch {
		return msgs, s.c.ProcessBatch(ctx, msgs)
	}
	results := make([]consumer.Result, len(msgs))
	for i, m := range msgs {
		results[i] = s.c.Process(ctx, m)
		if !results[i].Settled() {
			// Keep order: nothing after a retried message runs now.
			for j := i + 1; j < len(msgs); j++ {
				results[j] = consumer.Result{Outcome: consumer.Retry, Err: errNotAttempted}
			}
			break
		}
	}
	return msgs, results
}

// settle returns how many leading messages of batch are settled and may be
// committed, after publishing the dead letters among them.
func (s *Subscriber) settle(ctx context.Context, log *slog.Logger, batch []kafka.Message, results []consumer.Result) int {
	n := 0
	for n < len(results) && results[n].Settled() {
		n++
	}
	if s.dlq == nil {
		return n
	}
	var dead []kafka.Message
	var idx []int
	for i := range n {
		if o := results[i].Outcome; o == consumer.DeadLettered || o == consumer.Conflict {
			dead = append(dead, s.deadLetter(batch[i], results[i]))
			idx = append(idx, i)
		}
	}
	if len(dead) == 0 {
		return n
	}
	err := s.dlq.WriteMessages(ctx, dead...)
	if err == nil {
		return n
	}
	// Commit only up to the first dead letter that did not reach the topic.
	first := idx[0]
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == len(dead) {
		for j, e := range werrs {
			if e != nil {
				first = idx[j]
				break
			}
		}
	}
	log.WarnContext(ctx, "publish dead letter", slog.String("topic", s.cfg.DeadLetterTopic),
		slog.Int64("offset", batch[first].Offset), slog.Any("error", err))
	results[first] = consumer.Result{Outcome: consumer.Retry, Key: results[first].Key, Err: fmt.Errorf("idemq/kafka: publish dead letter: %w", err)}
	return first
}

func (s *Subscriber) deadLetter(m kafka.Message, r consumer.Result) kafka.Message {
	reason := "unknown"
	if r.Err != nil {
		reason = r.Err.Error()
	}
	if len(reason) > 4096 {
		reason = reason[:4096]
	}
	headers := make([]kafka.Header, 0, len(m.Headers)+4)
	hasID := false
	for _, h := range m.Headers {
		hasID = hasID || h.Key == s.cfg.IDHeader
		headers = append(headers, h)
	}
	if !hasID {
		headers = append(headers, kafka.Header{Key: s.cfg.IDHeader, Value: []byte(FallbackID(m))})
	}
	headers = append(headers,
		kafka.Header{Key: HeaderDeadLetterReason, Value: []byte(reason)},
		kafka.Header{Key: HeaderDeadLetterOutcome, Value: []byte(r.Outcome.String())},
		kafka.Header{Key: HeaderDeadLetterSource, Value: []byte(FallbackID(m))},
	)
	return kafka.Message{Topic: s.cfg.DeadLetterTopic, Key: m.Key, Value: m.Value, Headers: headers}
}

// message converts a record, choosing its id.
func (s *Subscriber) message(m kafka.Message) *consumer.Message {
	msg := &consumer.Message{Payload: m.Value, Source: m}
	if len(m.Headers) > 0 {
		msg.Headers = make(map[string]string, len(m.Headers))
	}
	found := false
	for _, h := range m.Headers {
		msg.Headers[h.Key] = string(h.Value)
		if h.Key == s.cfg.IDHeader {
			found = true
			msg.ID = string(h.Value)
		}
	}
	if !found || (s.cfg.FallbackOnInvalidID && s.c.Store().Validate(msg.ID, nil) != nil) {
		msg.ID = FallbackID(m)
	}
	return msg
}

func (s *Subscriber) setCrash(err error) {
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	if s.crash == nil {
		s.crash = fmt.Errorf("%w: %w", ErrCrash, err)
	}
}

func (s *Subscriber) crashed() bool {
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	return s.crash != nil
}
