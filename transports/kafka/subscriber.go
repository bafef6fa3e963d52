package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/segmentio/kafka-go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/transports/internal/inbound"
)

// errNotAttempted marks the messages after a retried one in per-message
// mode: they were not processed and are re-read after it.
var errNotAttempted = errors.New("idemq/kafka: an earlier message of the partition is retried")

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
	// Retry shapes the backoff (full jitter) before a message with a Retry
	// outcome is re-read, when the consumer gave no RetryAfter, and between
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
	for _, t := range c.Topics {
		if t == "" || t == c.DeadLetterTopic {
			return idemq.NewConfigError(component, "Topics", "topic %q is empty or the dead-letter topic", t)
		}
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
	r := &run{s: s, dlq: s.cfg.DeadLetterWriter}
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

// run is the state of one Run: its dead-letter writer and its crash latch,
// shared by the partition goroutines.
type run struct {
	s    *Subscriber
	dlq  *kafka.Writer
	stop context.CancelFunc

	mu       sync.Mutex
	crashErr error
}

// partition consumes one partition until the generation ends (a
// rebalance) or runCtx is done (shutdown, crash), committing after every
// processed group.
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
		if !w.fetchGroup(fetchCtx) {
			continue
		}
		msgs, results, settled := w.apply(fetchCtx)
		if !w.commitSettled(runCtx, msgs, results, settled) {
			return
		}
		if settled < len(w.group) && !w.rewind(runCtx, fetchCtx, results, settled) {
			return
		}
	}
}

// partitionWorker is the state of one partition within one generation.
type partitionWorker struct {
	r         *run
	gen       *kafka.Generation
	topic     string
	partition int
	log       *slog.Logger
	reader    *kafka.Reader

	// group is the fetched group being worked on.
	group []kafka.Message
	// retries counts the consecutive rewinds, for the backoff.
	retries int
	// redelivered counts, for offsets re-read after a Retry, how many times
	// this process delivered them before (Message.Delivery - 1).
	redelivered map[int64]int
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
		group:       make([]kafka.Message, 0, s.cfg.MaxBatch),
		redelivered: map[int64]int{},
		fetchBack:   reconnect(s.cfg.Retry),
	}
}

// reconnect is the backoff of a loop that reconnects (joins the group,
// fetches) until its context ends: the delays of r, without its bounds.
func reconnect(r idemq.Retry) backoff.BackOff {
	return idemq.Retry{BaseDelay: r.BaseDelay, MaxDelay: r.MaxDelay}.BackOff()
}

// fetchGroup waits for the next message and takes what the reader has
// already fetched behind it, up to MaxBatch. It reports false, after a
// backoff, when nothing could be fetched.
func (w *partitionWorker) fetchGroup(ctx context.Context) bool {
	w.group = w.group[:0]
	m, err := backoff.RetryNotifyWithData(func() (kafka.Message, error) { return w.reader.FetchMessage(ctx) },
		backoff.WithContext(w.fetchBack, ctx), func(err error, d time.Duration) {
			w.log.WarnContext(ctx, "fetch", slog.Any("error", err), slog.Duration("retry_in", d))
		})
	if err != nil {
		return false // ctx is done
	}
	w.group = append(w.group, m)
	for more := min(int(w.reader.Stats().QueueLength), w.r.s.cfg.MaxBatch-1); more > 0; more-- {
		m, err := w.reader.FetchMessage(ctx)
		if err != nil {
			break
		}
		w.group = append(w.group, m)
	}
	return true
}

// apply processes the group, publishes its dead letters and returns how
// many leading messages are settled. The work finishes even when the
// generation or the run ends, within ShutdownGrace.
func (w *partitionWorker) apply(fetchCtx context.Context) ([]*consumer.Message, []consumer.Result, int) {
	workCtx, cancel := lifecycle.Grace(fetchCtx, w.r.s.cfg.ShutdownGrace)
	defer cancel()
	msgs, results := w.r.s.process(workCtx, w.group, w.redelivered)
	return msgs, results, w.r.settle(workCtx, w.log, w.group, results)
}

// commitSettled commits the offset after the settled messages. It reports
// false when the run crashed (Test.BeforeCommit): nothing more may be
// committed.
func (w *partitionWorker) commitSettled(runCtx context.Context, msgs []*consumer.Message, results []consumer.Result, settled int) bool {
	if settled == 0 {
		return true
	}
	if hook := w.r.s.cfg.Test.BeforeCommit; hook != nil {
		if err := hook(runCtx, msgs[:settled], results[:settled]); err != nil {
			w.r.crashed(err)
			return false
		}
	}
	if w.r.crash() != nil {
		return false
	}
	next := w.group[settled-1].Offset + 1
	if err := w.gen.CommitOffsets(map[string]map[int]int64{w.topic: {w.partition: next}}); err != nil {
		// The work is durable; a redelivery is deduplicated.
		w.log.WarnContext(runCtx, "commit offset", slog.Int64("offset", next), slog.Any("error", err))
	}
	// Counts of committed records are done with; a record fetched in a
	// later group than its predecessors keeps its count.
	for off := range w.redelivered {
		if off < next {
			delete(w.redelivered, off)
		}
	}
	if settled == len(w.group) {
		w.retries = 0
	}
	return true
}

// rewind re-reads the partition from the first unsettled message after
// its RetryAfter or a backoff: a Retry is never skipped. It reports false
// when the reader cannot seek.
func (w *partitionWorker) rewind(runCtx, fetchCtx context.Context, results []consumer.Result, settled int) bool {
	for j := settled; j < len(w.group); j++ {
		if results[j].Outcome == consumer.Retry && !errors.Is(results[j].Err, errNotAttempted) {
			w.redelivered[w.group[j].Offset]++
		}
	}
	w.retries++
	res := results[settled]
	delay := res.RetryAfter
	if delay <= 0 {
		delay = w.r.s.cfg.Retry.Delay(w.retries, 0)
	}
	w.log.WarnContext(runCtx, "message will be redelivered", slog.Int64("offset", w.group[settled].Offset),
		slog.String("key", res.Key), slog.Duration("after", delay), slog.Any("error", res.Err))
	_ = lifecycle.Sleep(fetchCtx, delay)
	if err := w.reader.SetOffset(w.group[settled].Offset); err != nil {
		w.log.ErrorContext(runCtx, "seek back", slog.Any("error", err))
		return false
	}
	return true
}

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
func (r *run) settle(ctx context.Context, log *slog.Logger, batch []kafka.Message, results []consumer.Result) int {
	n := 0
	for n < len(results) && results[n].Settled() {
		n++
	}
	if r.dlq == nil {
		return n
	}
	var dead []kafka.Message
	var idx []int
	for i := range n {
		if o := results[i].Outcome; o == consumer.DeadLettered || o == consumer.Conflict {
			dead = append(dead, r.s.deadLetter(batch[i], results[i]))
			idx = append(idx, i)
		}
	}
	if len(dead) == 0 {
		return n
	}
	err := r.dlq.WriteMessages(ctx, dead...)
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
	log.WarnContext(ctx, "publish dead letter", slog.String("topic", r.s.cfg.DeadLetterTopic),
		slog.Int64("offset", batch[first].Offset), slog.Any("error", err))
	results[first] = consumer.Result{Outcome: consumer.Retry, Key: results[first].Key, Err: fmt.Errorf("idemq/kafka: publish dead letter: %w", err)}
	return first
}

func (s *Subscriber) deadLetter(m kafka.Message, r consumer.Result) kafka.Message {
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
		kafka.Header{Key: consumer.HeaderDeadLetterReason, Value: []byte(errtext.Of(r.Err))},
		kafka.Header{Key: consumer.HeaderDeadLetterOutcome, Value: []byte(r.Outcome.String())},
		kafka.Header{Key: consumer.HeaderDeadLetterSource, Value: []byte(FallbackID(m))},
	)
	return kafka.Message{Topic: s.cfg.DeadLetterTopic, Key: m.Key, Value: m.Value, Headers: headers}
}

// message converts a record, choosing its id.
func (s *Subscriber) message(m kafka.Message) *consumer.Message {
	msg := &consumer.Message{Payload: m.Value, Source: m}
	if msg.Payload == nil {
		msg.Payload = []byte{} // a tombstone is a valid message with an empty payload
	}
	if len(m.Headers) > 0 {
		msg.Headers = make(map[string]string, len(m.Headers))
	}
	var id string
	found := false
	for _, h := range m.Headers {
		msg.Headers[h.Key] = string(h.Value)
		if h.Key == s.cfg.IDHeader {
			found, id = true, string(h.Value)
		} else if strings.EqualFold(h.Key, s.cfg.IDHeader) {
			s.warnIDCase(h.Key)
		}
	}
	msg.ID = inbound.ID(s.c, id, found, s.cfg.FallbackOnInvalidID, func() string { return FallbackID(m) })
	return msg
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
