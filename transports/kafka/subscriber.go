package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/transports/internal/inbound"
)

// The defaults of [SubscriberConfig].
const (
	MaxBatchDefault          = 100
	MaxWaitDefault           = time.Second
	MaxBytesDefault          = 10 << 20
	ShutdownGraceDefault     = 30 * time.Second
	SessionTimeoutDefault    = 30 * time.Second // kafka-go's
	HeartbeatIntervalDefault = 3 * time.Second  // kafka-go's
	RebalanceTimeoutDefault  = 30 * time.Second // kafka-go's
)

// RetryDefault is the default [SubscriberConfig.Retry].
var RetryDefault = idemq.Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: 5 * time.Second}

// minWireDuration and maxWireDuration bound the durations the Kafka
// protocol carries as int32 milliseconds (the group timeouts, a fetch's
// MaxWait): below 1ms a value would be sent as 0.
const (
	minWireDuration = time.Millisecond
	maxWireDuration = math.MaxInt32 * time.Millisecond
)

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

	// IDHeader names the header holding the message id. A message without
	// it gets the id [FallbackID], "topic/partition/offset", stable across
	// redeliveries of that one record but different for a producer's
	// re-send: such producers should set the header (or the consumer derive
	// its key from the payload). Header names are case-sensitive: a record
	// carrying the header in another letter case gets the fallback id too,
	// and Run logs a warning the first time it sees one. Defaults to
	// [IDHeaderDefault].
	IDHeader string
	// FallbackOnInvalidID gives a message whose id header is present but
	// unusable as a key (empty, over the key limit, not valid UTF-8, with
	// NUL) the topic/partition/offset id instead, and processes it.
	// Defaults to false: the consumer dead-letters the message with
	// consumer.ErrInvalidMessage (published to DeadLetterTopic if set), so
	// a producer bug is seen rather than half-deduplicated. Either way the
	// partition moves on. A consumer whose KeyFunc derives the key from the
	// payload is not affected.
	FallbackOnInvalidID bool

	// Batch applies what was fetched for a partition with
	// consumer.ProcessBatch (one transaction, a savepoint per message
	// where a handler fails); a consumer made by consumer.NewBatched gets
	// the fetch's new messages in one call of its batch handler. Either way offsets are committed once per fetched group. Batch mode
	// keeps partition order for messages that succeed at their first
	// attempt; one whose handler fails is retried after its batch
	// committed, so after the later messages of that batch. Use
	// per-message mode where a failure must hold back its successors.
	// Defaults to false: consumer.Process, one transaction per message.
	Batch bool
	// MaxBatch bounds the messages taken from a partition's fetch queue at
	// once. Defaults to [MaxBatchDefault].
	MaxBatch int

	// DeadLetterTopic, if set, receives a copy of every message the consumer
	// settles as DeadLettered or Conflict (key, value and headers, plus the
	// consumer.HeaderDeadLetter* headers and the id header), before its offset is
	// committed. Delivery is at least once: a crash before the commit
	// re-publishes with the same id header.
	DeadLetterTopic string
	// DeadLetterWriter writes to DeadLetterTopic; the Subscriber does not
	// close it. Defaults to a [NewWriter](Brokers...) dialling with
	// Dialer's TLS, SASL and client id, opened and closed by each Run.
	DeadLetterWriter *kafka.Writer

	// StartOffset is where a group without a committed offset starts:
	// kafka.FirstOffset or kafka.LastOffset. Defaults to kafka.FirstOffset.
	StartOffset int64
	// MaxWait bounds how long a fetch waits for data. The fetch request
	// carries it in whole milliseconds, so it is at least 1ms: a shorter
	// one would reach the broker as 0, "answer at once", and an idle
	// partition would be fetched in a busy loop. Defaults to
	// [MaxWaitDefault].
	MaxWait time.Duration
	// MaxBytes bounds a fetch response. Defaults to [MaxBytesDefault].
	MaxBytes int
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are passed to
	// the consumer group; HeartbeatInterval must be below SessionTimeout.
	// The group protocol carries SessionTimeout and RebalanceTimeout in
	// whole milliseconds, so they are at least 1ms (a shorter one would
	// reach the broker as 0); HeartbeatInterval has the same floor, as a
	// faster heartbeat would only load the coordinator. Default to [SessionTimeoutDefault], [HeartbeatIntervalDefault] and
	// [RebalanceTimeoutDefault].
	SessionTimeout, HeartbeatInterval, RebalanceTimeout time.Duration
	// ShutdownGrace bounds how long Run, once its context is cancelled,
	// lets the in-flight groups finish before cancelling them (unfinished
	// messages are then redelivered). Defaults to [ShutdownGraceDefault].
	ShutdownGrace time.Duration
	// Retry shapes the backoff (full jitter) before held messages (a
	// Retry outcome and the messages behind it) are processed again, when
	// the consumer gave no RetryAfter (a database outage), and between
	// failed group joins and fetches. Only BaseDelay and MaxDelay apply:
	// the consumer counts attempts. Defaults to [RetryDefault].
	Retry idemq.Retry
	// Dialer is used for every broker connection. Defaults to kafka-go's.
	Dialer *kafka.Dialer
	// Logger receives rebalances, commit failures and retries. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Test holds crash points for tests; leave it zero in production.
	Test TestConfig
}

// TestConfig holds a [Subscriber]'s crash points, for tests and chaos
// drills.
type TestConfig struct {
	// BeforeCommit, if set, runs after a fetched group of messages was
	// processed and before its offset is committed; results[i] is the
	// outcome of msgs[i]. A non-nil error vetoes the commit and stops Run at
	// once, without committing anything more, and Run returns it wrapped: a
	// crash between the database commit and the offset commit.
	BeforeCommit func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error
}

const component = "kafka.Subscriber"

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	c.IDHeader = cmp.Or(c.IDHeader, IDHeaderDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	c.MaxBytes = cmp.Or(c.MaxBytes, MaxBytesDefault)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, SessionTimeoutDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, HeartbeatIntervalDefault)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, RebalanceTimeoutDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// validate checks a config with its defaults filled in.
func (c SubscriberConfig) validate() error {
	switch {
	case len(c.Brokers) == 0:
		return idemq.NewConfigError(component, "Brokers", "is empty")
	case c.GroupID == "":
		return idemq.NewConfigError(component, "GroupID", "is empty")
	case len(c.Topics) == 0:
		return idemq.NewConfigError(component, "Topics", "is empty")
	case c.MaxBatch < 0:
		return idemq.NewConfigError(component, "MaxBatch", "%d is negative", c.MaxBatch)
	case c.MaxBytes < 0:
		return idemq.NewConfigError(component, "MaxBytes", "%d is negative", c.MaxBytes)
	case c.ShutdownGrace < 0:
		return idemq.NewConfigError(component, "ShutdownGrace", "%v is negative", c.ShutdownGrace)
	case c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return idemq.NewConfigError(component, "StartOffset", "%d is neither kafka.FirstOffset nor kafka.LastOffset", c.StartOffset)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"MaxWait", c.MaxWait}, {"SessionTimeout", c.SessionTimeout}, {"HeartbeatInterval", c.HeartbeatInterval}, {"RebalanceTimeout", c.RebalanceTimeout}} {
		if f.d < minWireDuration || f.d >= maxWireDuration {
			return idemq.NewConfigError(component, f.name, "%v is out of range [%v, %v): the Kafka protocol sends it in whole milliseconds; leave it 0 for the default",
				f.d, minWireDuration, maxWireDuration)
		}
	}
	if c.HeartbeatInterval >= c.SessionTimeout {
		return idemq.NewConfigError(component, "HeartbeatInterval", "%v is not below SessionTimeout %v: the group would evict the member between heartbeats",
			c.HeartbeatInterval, c.SessionTimeout)
	}
	if err := inbound.CheckTopics(component, c.Topics, c.DeadLetterTopic); err != nil {
		return err
	}
	return c.Retry.Validate(component)
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
// retried message and those behind it are held and processed again, in
// order, after its RetryAfter (or a backoff). While the database is down
// (consumer.Result.Unavailable) the partition waits with a capped,
// jittered backoff and fetches nothing, no message of a key overtakes an
// earlier one, and the log says once that the database is gone and once
// that it is back, with the count of the messages that waited. A crash
// anywhere between the database commit and the offset commit means a
// redelivery that the inbox recognises as a Duplicate.
//
// A rebalance lets each revoked partition finish and commit its in-flight
// group before the member rejoins; whatever did not commit is redelivered
// to the partition's next owner and deduplicated there.
//
// Message.Delivery is 1 on the first delivery of a record to this process
// and counts up each time the Retry of a failed attempt makes the
// Subscriber process it again (a database outage is not one), so a
// consumer with Config.Redeliver counts its attempts (Kafka keeps no
// delivery count across processes: after a restart it starts at 1 again).
//
// The handler sees the Kafka record: Message.Headers holds its headers
// (the last value wins for a repeated name), Message.Source is the
// kafka.Message with key, topic, partition, offset and time; see [Source].
// A record with an empty value or a tombstone (nil value) is a message
// with an empty payload.
//
// A Subscriber is an idemq.Service: one Run at a time, and Run may be
// called again after it returned.
type Subscriber struct {
	c        *consumer.Consumer
	cfg      SubscriberConfig
	groupCfg kafka.ConsumerGroupConfig
	log      *slog.Logger
	ids      inbound.IDs
	state    lifecycle.State

	idCaseWarned atomic.Bool
}

// NewSubscriber returns a Subscriber applying messages through c. It
// validates cfg; it does not contact the brokers (Run does).
func NewSubscriber(c *consumer.Consumer, cfg SubscriberConfig) (*Subscriber, error) {
	if c == nil {
		return nil, idemq.NewConfigError(component, "consumer", "is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Subscriber{
		c:   c,
		cfg: cfg,
		log: cfg.Logger.With(slog.String("group", cfg.GroupID), slog.String("scope", c.Scope())),
	}
	s.ids = inbound.IDs{Consumer: c, Header: cfg.IDHeader, FallbackOnInvalid: cfg.FallbackOnInvalidID, OtherCase: s.warnIDCase}
	s.groupCfg = kafka.ConsumerGroupConfig{
		ID:                cfg.GroupID,
		Brokers:           cfg.Brokers,
		Dialer:            cfg.Dialer,
		Topics:            cfg.Topics,
		StartOffset:       cfg.StartOffset,
		SessionTimeout:    cfg.SessionTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		RebalanceTimeout:  cfg.RebalanceTimeout,
		ErrorLogger:       kafka.LoggerFunc(func(f string, a ...any) { s.log.Debug(fmt.Sprintf(f, a...)) }),
	}
	if err := s.groupCfg.Validate(); err != nil {
		return nil, idemq.NewConfigError(component, "SubscriberConfig", "kafka-go refuses the consumer group: %v", err)
	}
	return s, nil
}

// Source returns the Kafka record a message came from, for handlers that
// need its key, topic, partition, offset or time.
func Source(msg *consumer.Message) (kafka.Message, bool) {
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

// Ready is closed once Run has joined the consumer group.
func (s *Subscriber) Ready() <-chan struct{} { return s.state.Ready() }

// Run joins the group and consumes until ctx is cancelled, then finishes
// the in-flight groups (up to ShutdownGrace), commits them, leaves the
// group and returns nil. Broker and database failures are logged and
// retried. Run returns idemq.ErrRunning while another Run is active, and
// the error of a Test.BeforeCommit veto.
func (s *Subscriber) Run(ctx context.Context) error {
	ready, end, err := s.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	r := &run{s: s, dlq: s.cfg.DeadLetterWriter,
		kernel: inbound.New(inbound.Config{Retry: s.cfg.Retry, Logger: s.log})}
	r.process = r.kernel.Processor(s.c, s.cfg.Batch)
	if s.cfg.DeadLetterTopic != "" && r.dlq == nil {
		r.dlq = s.deadLetterWriter()
		defer func() {
			_ = r.dlq.Close()
			r.dlq.Transport.(*kafka.Transport).CloseIdleConnections()
		}()
	}
	group, err := kafka.NewConsumerGroup(s.groupCfg)
	if err != nil {
		return fmt.Errorf("idemq/kafka: consumer group: %w", err)
	}

	// runCtx ends on shutdown or on a crash.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r.stop = stop
	var workers sync.WaitGroup
	join := reconnect(s.cfg.Retry)
	for runCtx.Err() == nil {
		gen, err := backoff.RetryNotifyWithData(func() (*kafka.Generation, error) {
			gen, err := group.Next(runCtx)
			if errors.Is(err, kafka.ErrGroupClosed) {
				return nil, backoff.Permanent(err)
			}
			return gen, err
		}, backoff.WithContext(join, runCtx), func(err error, d time.Duration) {
			s.log.WarnContext(ctx, "joining consumer group", slog.Any("error", err), slog.Duration("retry_in", d))
		})
		if err != nil {
			break // shut down, crashed, or the group was closed
		}
		s.log.InfoContext(ctx, "joined consumer group", slog.Int("generation", int(gen.ID)), slog.Any("assignments", assignments(gen)))
		for topic, parts := range gen.Assignments {
			for _, p := range parts {
				workers.Add(1)
				gen.Start(func(genCtx context.Context) {
					defer workers.Done()
					r.partition(runCtx, genCtx, gen, topic, p.ID, p.Offset)
				})
			}
		}
		ready()
	}
	// Let every partition finish and commit its in-flight group while the
	// generation is still ours, then leave the group.
	workers.Wait()
	if err := group.Close(); err != nil {
		s.log.WarnContext(ctx, "leaving consumer group", slog.Any("error", err))
	}
	return r.crash()
}

// deadLetterWriter returns a Writer for DeadLetterTopic on a transport of
// its own, so that Run can close its connections, dialling like the
// consumer group does.
func (s *Subscriber) deadLetterWriter() *kafka.Writer {
	w := NewWriter(s.cfg.Brokers...)
	t := &kafka.Transport{}
	if d := s.cfg.Dialer; d != nil {
		t.TLS, t.SASL, t.ClientID = d.TLS, d.SASLMechanism, d.ClientID
		if d.DialFunc != nil {
			t.Dial = d.DialFunc
		}
	}
	w.Transport = t
	return w
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

// run is the state of one Run: its dead-letter writer, its settle kernel
// and its crash latch, shared by the partition goroutines.
type run struct {
	s       *Subscriber
	dlq     *kafka.Writer
	kernel  *inbound.Kernel
	process inbound.Process
	stop    context.CancelFunc

	mu       sync.Mutex
	crashErr error
}

// partition consumes one partition until the generation ends (a
// rebalance) or runCtx is done (shutdown, crash), committing after every
// settled part of a fetched group. It fetches nothing while a group's
// messages are held (a database outage).
func (r *run) partition(runCtx, genCtx context.Context, gen *kafka.Generation, topic string, partition int, offset int64) {
	// fetchCtx ends with the generation or the run; the work on a fetched
	// group outlives it by ShutdownGrace.
	fetchCtx, cancelFetch := context.WithCancel(runCtx)
	defer cancelFetch()
	stopAfter := context.AfterFunc(genCtx, cancelFetch)
	defer stopAfter()

	w := r.newPartitionWorker(gen, topic, partition)
	defer w.reader.Close()
	if err := w.reader.SetOffset(offset); err != nil {
		w.log.ErrorContext(runCtx, "seek", slog.Int64("offset", offset), slog.Any("error", err))
		return
	}
	for fetchCtx.Err() == nil {
		msgs := w.fetchGroup(fetchCtx)
		if len(msgs) == 0 {
			continue
		}
		workCtx, cancel := lifecycle.Grace(fetchCtx, r.s.cfg.ShutdownGrace)
		err := r.kernel.Group(fetchCtx, workCtx, msgs, r.process, w)
		cancel()
		if err != nil {
			return // a crash, or the generation or the run ended with messages held
		}
	}
}

// partitionWorker is the state of one partition within one generation,
// and the kafka-go half of its settling (an inbound.Client).
type partitionWorker struct {
	r         *run
	gen       *kafka.Generation
	topic     string
	partition int
	log       *slog.Logger
	reader    *kafka.Reader

	// fetchBack spaces the retries of a failed fetch.
	fetchBack backoff.BackOff
}

func (r *run) newPartitionWorker(gen *kafka.Generation, topic string, partition int) *partitionWorker {
	s := r.s
	log := s.log.With(slog.String("topic", topic), slog.Int("partition", partition))
	return &partitionWorker{
		r: r, gen: gen, topic: topic, partition: partition, log: log,
		reader: kafka.NewReader(kafka.ReaderConfig{
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
		}),
		fetchBack: reconnect(s.cfg.Retry),
	}
}

// reconnect is the backoff of a loop that reconnects (joins the group,
// fetches) until its context ends: the delays of r, without its bounds.
func reconnect(r idemq.Retry) backoff.BackOff {
	return idemq.Retry{BaseDelay: r.BaseDelay, MaxDelay: r.MaxDelay}.BackOff()
}

// fetchGroup waits for the next message and takes what the reader has
// already fetched behind it, up to MaxBatch, as consumer messages. It
// returns none, after a backoff, when nothing could be fetched.
func (w *partitionWorker) fetchGroup(ctx context.Context) []*consumer.Message {
	m, err := backoff.RetryNotifyWithData(func() (kafka.Message, error) { return w.reader.FetchMessage(ctx) },
		backoff.WithContext(w.fetchBack, ctx), func(err error, d time.Duration) {
			w.log.WarnContext(ctx, "fetch", slog.Any("error", err), slog.Duration("retry_in", d))
		})
	if err != nil {
		return nil // ctx is done
	}
	msgs := []*consumer.Message{w.r.s.message(m)}
	for more := min(int(w.reader.Stats().QueueLength), w.r.s.cfg.MaxBatch-1); more > 0; more-- {
		m, err := w.reader.FetchMessage(ctx)
		if err != nil {
			break
		}
		msgs = append(msgs, w.r.s.message(m))
	}
	return msgs
}

// DeadLetter writes the copies of the dead letters among msgs in one
// batch; it reports how many leading ones reached the topic.
func (w *partitionWorker) DeadLetter(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, dead []int) (int, error) {
	if w.r.dlq == nil {
		return len(dead), nil
	}
	copies := make([]kafka.Message, len(dead))
	for j, i := range dead {
		copies[j] = w.r.s.deadLetter(msgs[i], results[i])
	}
	err := w.r.dlq.WriteMessages(ctx, copies...)
	if err == nil {
		return len(dead), nil
	}
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) && len(werrs) == len(dead) {
		for j, e := range werrs {
			if e != nil {
				return j, fmt.Errorf("idemq/kafka: publish dead letter to %s: %w", w.r.s.cfg.DeadLetterTopic, e)
			}
		}
	}
	return 0, fmt.Errorf("idemq/kafka: publish dead letter to %s: %w", w.r.s.cfg.DeadLetterTopic, err)
}

// Settle commits the offset after msgs, which all settled. It returns the
// error of a Test.BeforeCommit veto, after which nothing more is
// committed.
func (w *partitionWorker) Settle(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, _ []inbound.Step) error {
	if hook := w.r.s.cfg.Test.BeforeCommit; hook != nil {
		if err := hook(ctx, msgs, results); err != nil {
			w.r.crashed(err)
		}
	}
	if err := w.r.crash(); err != nil {
		return err
	}
	last, _ := Source(msgs[len(msgs)-1])
	next := last.Offset + 1
	if err := w.gen.CommitOffsets(map[string]map[int]int64{w.topic: {w.partition: next}}); err != nil {
		// The work is durable; a redelivery is deduplicated.
		w.log.WarnContext(ctx, "commit offset", slog.Int64("offset", next), slog.Any("error", err))
	}
	return nil
}

// Release does nothing: the offset is not committed past held messages,
// so the partition's next reader starts at the first of them.
func (w *partitionWorker) Release([]*consumer.Message) {}

// crashed latches the first Test.BeforeCommit veto and stops the run.
func (r *run) crashed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.crashErr == nil {
		r.crashErr = fmt.Errorf("idemq/kafka: commit vetoed by Test.BeforeCommit: %w", err)
	}
	r.stop()
}

func (r *run) crash() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crashErr
}

// deadLetter is the copy of msg, a dead letter or a conflict, for
// DeadLetterTopic.
func (s *Subscriber) deadLetter(msg *consumer.Message, r consumer.Result) kafka.Message {
	m, _ := Source(msg)
	return kafka.Message{Topic: s.cfg.DeadLetterTopic, Key: m.Key, Value: m.Value,
		Headers: inbound.DeadLetterRecord(m.Headers, s.cfg.IDHeader, FallbackID(m), r)}
}

// message converts a record, choosing its id.
func (s *Subscriber) message(m kafka.Message) *consumer.Message {
	return inbound.Record(s.ids, m.Value, m.Headers, m, func() string { return FallbackID(m) })
}

// warnIDCase warns, once per Subscriber, about an id header spelled in
// another letter case than IDHeader: Kafka header names are case-sensitive,
// so such records get the fallback id, which a producer's re-send does not
// share.
func (s *Subscriber) warnIDCase(name string) {
	if s.idCaseWarned.CompareAndSwap(false, true) {
		s.log.Warn("idemq/kafka: a record carries the id header in another letter case; it is ignored and the record gets the topic/partition/offset id",
			slog.String("header", name), slog.String("id_header", s.cfg.IDHeader))
	}
}
