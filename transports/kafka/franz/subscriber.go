package franz

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/transports/internal/inbound"
)

// The defaults of [SubscriberConfig].
const (
	MaxBatchDefault      = 100
	ShutdownGraceDefault = 30 * time.Second
)

// RetryDefault is the default [SubscriberConfig.Retry].
var RetryDefault = idemq.Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: 5 * time.Second}

// SubscriberConfig configures a [Subscriber]. Zero fields take the
// documented defaults.
type SubscriberConfig struct {
	// GroupID is the Kafka consumer group. Required.
	GroupID string
	// Topics are the topics to consume. Required.
	Topics []string
	// ReadCommitted reads only committed transactional records
	// (isolation.level=read_committed), as a consumer of a [TxSink]'s
	// topics should. Defaults to false, Kafka's read_uncommitted.
	ReadCommitted bool

	// IDHeader names the header holding the message id. A record without
	// it gets the id [FallbackID], "topic/partition/offset". Defaults to
	// [IDHeaderDefault].
	IDHeader string
	// FallbackOnInvalidID gives a record whose id header is present but
	// unusable as a key the fallback id instead of dead-lettering it, as
	// in package transports/kafka.
	FallbackOnInvalidID bool

	// Batch applies what a poll returned for a partition with
	// consumer.ProcessBatch (one transaction, a savepoint per message)
	// and commits once. Defaults to false: consumer.Process, one
	// transaction per message, stopping at the first retried one.
	Batch bool
	// MaxBatch bounds the records of a partition processed (and
	// committed) at once. Defaults to [MaxBatchDefault].
	MaxBatch int
	// DeadLetterTopic, if set, receives a copy of every message the
	// consumer settles as DeadLettered or Conflict (with the
	// consumer.HeaderDeadLetter* headers) before its offset is committed.
	DeadLetterTopic string

	// ShutdownGrace bounds how long Run, once its context is cancelled,
	// lets the polled records finish. Defaults to [ShutdownGraceDefault].
	ShutdownGrace time.Duration
	// Retry shapes the backoff before a retried message is read again
	// when the consumer gave no RetryAfter. Defaults to [RetryDefault].
	Retry idemq.Retry
	// Logger receives rebalances, commit failures and retries. Defaults
	// to slog.Default().
	Logger *slog.Logger

	// Test holds crash points for tests; leave it zero in production.
	Test TestConfig
}

// TestConfig holds a [Subscriber]'s crash points, for tests and chaos
// drills.
type TestConfig struct {
	// BeforeCommit, if set, runs after a polled partition's records were
	// processed and before their offset is committed. A non-nil error
	// vetoes the commit and stops Run at once, without committing
	// anything more; Run returns it wrapped.
	BeforeCommit func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error
}

const subscriberComponent = "franz.Subscriber"

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	c.IDHeader = cmp.Or(c.IDHeader, IDHeaderDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

func (c SubscriberConfig) validate() error {
	switch {
	case c.GroupID == "":
		return idemq.NewConfigError(subscriberComponent, "GroupID", "is empty")
	case len(c.Topics) == 0:
		return idemq.NewConfigError(subscriberComponent, "Topics", "is empty")
	case c.MaxBatch < 0:
		return idemq.NewConfigError(subscriberComponent, "MaxBatch", "%d is negative", c.MaxBatch)
	case c.ShutdownGrace < 0:
		return idemq.NewConfigError(subscriberComponent, "ShutdownGrace", "%v is negative", c.ShutdownGrace)
	}
	if err := inbound.CheckTopics(subscriberComponent, c.Topics, c.DeadLetterTopic); err != nil {
		return err
	}
	for _, t := range c.Topics {
		if err := checkTopic(subscriberComponent, "Topics", t); err != nil {
			return err
		}
	}
	if c.DeadLetterTopic != "" {
		if err := checkTopic(subscriberComponent, "DeadLetterTopic", c.DeadLetterTopic); err != nil {
			return err
		}
	}
	return c.Retry.Validate(subscriberComponent)
}

// Subscriber consumes Kafka topics with franz-go as a member of a
// consumer group and applies every message through a consumer.Consumer,
// effectively once, like package transports/kafka's Subscriber: offsets
// are committed only after the message's transaction committed or the
// consumer recognised it as a duplicate, a conflict or a dead letter; a
// Retry outcome re-reads its partition from that message. Rebalances wait
// for the polled records to be processed and committed (kgo's
// BlockRebalanceOnPoll), so a revoked partition's next owner starts where
// this one stopped.
//
// Each poll's partitions are processed concurrently, each in offset order;
// the next poll waits for all of them. With [SubscriberConfig.ReadCommitted]
// it reads what a [TxSink] committed and nothing it aborted.
//
// A Subscriber is an idemq.Service: one Run at a time.
type Subscriber struct {
	c     *consumer.Consumer
	cfg   SubscriberConfig
	opts  []kgo.Opt
	log   *slog.Logger
	state lifecycle.State
}

// NewSubscriber returns a Subscriber applying messages through c, on kgo
// clients made of opts (at least kgo.SeedBrokers; TLS, SASL, client id as
// needed) and the group options it needs, which come last and win. It
// validates cfg; it does not contact the brokers (Run does).
func NewSubscriber(c *consumer.Consumer, cfg SubscriberConfig, opts ...kgo.Opt) (*Subscriber, error) {
	if c == nil {
		return nil, idemq.NewConfigError(subscriberComponent, "consumer", "is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Subscriber{c: c, cfg: cfg, log: cfg.Logger.With(slog.String("group", cfg.GroupID), slog.String("scope", c.Scope()))}
	isolation := kgo.ReadUncommitted()
	if cfg.ReadCommitted {
		isolation = kgo.ReadCommitted()
	}
	s.opts = append(append([]kgo.Opt{}, opts...),
		kgo.ConsumerGroup(cfg.GroupID),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(isolation),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)
	return s, nil
}

// Source returns the Kafka record a message came from.
func Source(msg *consumer.Message) (*kgo.Record, bool) {
	if msg == nil {
		return nil, false
	}
	r, ok := msg.Source.(*kgo.Record)
	return r, ok
}

// FallbackID is the id of a record without an id header:
// "topic/partition/offset".
func FallbackID(r *kgo.Record) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

// Ready is closed once Run has joined the consumer group and got its
// first assignment.
func (s *Subscriber) Ready() <-chan struct{} { return s.state.Ready() }

// Run consumes until ctx is cancelled, then finishes the polled records
// (within ShutdownGrace), commits them, leaves the group and returns nil.
// Broker and database failures are logged and retried. Run returns
// idemq.ErrRunning while another Run is active, and the error of a
// Test.BeforeCommit veto.
func (s *Subscriber) Run(ctx context.Context) error {
	ready, end, err := s.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	opts := append(s.opts, kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { ready() }))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("idemq/franz: consumer client: %w", err)
	}
	defer cl.Close()
	r := &run{redelivered: map[string]int{}}
	for ctx.Err() == nil && r.crash() == nil {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			cl.AllowRebalance()
			break
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				s.log.WarnContext(ctx, "fetch", slog.String("topic", topic), slog.Int("partition", int(p)), slog.Any("error", err))
			}
		})
		var wg sync.WaitGroup
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			wg.Go(func() {
				// MaxBatch records at a time, in order; a rewind drops
				// the rest (they are fetched again).
				for recs := p.Records; len(recs) > 0 && r.crash() == nil; {
					n := min(len(recs), s.cfg.MaxBatch)
					if !s.partition(ctx, cl, recs[:n], r) {
						return
					}
					recs = recs[n:]
				}
			})
		})
		wg.Wait()
		cl.AllowRebalance()
	}
	// After a crash: die the way a killed process would, no more commits.
	return r.crash()
}

// run is the state of one Run, shared by the partitions of a poll.
type run struct {
	mu          sync.Mutex
	redelivered map[string]int // "topic/partition/offset" -> earlier deliveries
	crashErr    error
}

func (r *run) crashed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.crashErr == nil {
		r.crashErr = fmt.Errorf("idemq/franz: commit vetoed by Test.BeforeCommit: %w", err)
	}
}

func (r *run) crash() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.crashErr
}

// partition processes one partition's polled records and commits the
// settled ones; after the first unsettled one it rewinds the partition to
// it, after its RetryAfter or a backoff, and reports false. A
// Test.BeforeCommit veto crashes the run.
func (s *Subscriber) partition(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, r *run) bool {
	workCtx, cancel := lifecycle.Grace(ctx, s.cfg.ShutdownGrace)
	defer cancel()
	msgs := make([]*consumer.Message, len(recs))
	r.mu.Lock()
	for i, rec := range recs {
		msgs[i] = s.message(rec)
		msgs[i].Delivery = 1 + r.redelivered[FallbackID(rec)]
	}
	r.mu.Unlock()
	var results []consumer.Result
	if s.cfg.Batch {
		results = s.c.ProcessBatch(workCtx, msgs)
	} else {
		results = make([]consumer.Result, len(msgs))
		for i, m := range msgs {
			results[i] = s.c.Process(workCtx, m)
			if !results[i].Settled() {
				for j := i + 1; j < len(msgs); j++ {
					results[j] = consumer.Result{Outcome: consumer.Retry, Err: errNotAttempted}
				}
				break
			}
		}
	}
	settled := s.settle(workCtx, cl, recs, results)
	if settled > 0 {
		if hook := s.cfg.Test.BeforeCommit; hook != nil {
			if err := hook(ctx, msgs[:settled], results[:settled]); err != nil {
				r.crashed(err)
			}
		}
		if r.crash() != nil {
			return false
		}
		if err := cl.CommitRecords(workCtx, recs[settled-1]); err != nil {
			// The work is durable; a redelivery is deduplicated.
			s.log.WarnContext(ctx, "commit offset", slog.String("record", FallbackID(recs[settled-1])), slog.Any("error", err))
		}
	}
	r.mu.Lock()
	for i := range settled {
		delete(r.redelivered, FallbackID(recs[i]))
	}
	for j := settled; j < len(recs); j++ {
		if results[j].Outcome == consumer.Retry && !errors.Is(results[j].Err, errNotAttempted) {
			r.redelivered[FallbackID(recs[j])]++
		}
	}
	r.mu.Unlock()
	if settled == len(recs) {
		return true
	}
	res, first := results[settled], recs[settled]
	delay := res.RetryAfter
	if delay <= 0 {
		delay = s.cfg.Retry.Delay(msgs[settled].Delivery, 0)
	}
	s.log.WarnContext(ctx, "message will be redelivered", slog.String("record", FallbackID(first)),
		slog.String("key", res.Key), slog.Duration("after", delay), slog.Any("error", res.Err))
	_ = lifecycle.Sleep(ctx, delay)
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{first.Topic: {first.Partition: {Epoch: -1, Offset: first.Offset}}})
	return false
}

// errNotAttempted marks the messages after a retried one in per-message
// mode: they were not processed and are read again after it.
var errNotAttempted = errors.New("idemq/franz: an earlier message of the partition is retried")

// settle returns how many leading records are settled and may be
// committed, after publishing the dead letters among them.
func (s *Subscriber) settle(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, results []consumer.Result) int {
	n := inbound.Settled(results)
	if s.cfg.DeadLetterTopic == "" {
		return n
	}
	for i := range n {
		if o := results[i].Outcome; o != consumer.DeadLettered && o != consumer.Conflict {
			continue
		}
		if err := cl.ProduceSync(ctx, s.deadLetter(recs[i], results[i])).FirstErr(); err != nil {
			s.log.WarnContext(ctx, "publish dead letter", slog.String("topic", s.cfg.DeadLetterTopic),
				slog.String("record", FallbackID(recs[i])), slog.Any("error", err))
			results[i] = consumer.Result{Outcome: consumer.Retry, Key: results[i].Key, Err: fmt.Errorf("idemq/franz: publish dead letter: %w", err)}
			return i
		}
	}
	return n
}

func (s *Subscriber) deadLetter(r *kgo.Record, res consumer.Result) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+4)
	hasID := false
	for _, h := range r.Headers {
		hasID = hasID || h.Key == s.cfg.IDHeader
		headers = append(headers, h)
	}
	if !hasID {
		headers = append(headers, kgo.RecordHeader{Key: s.cfg.IDHeader, Value: []byte(FallbackID(r))})
	}
	for _, h := range inbound.DeadLetterHeaders(res, FallbackID(r)) {
		headers = append(headers, kgo.RecordHeader{Key: h[0], Value: []byte(h[1])})
	}
	return &kgo.Record{Topic: s.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value, Headers: headers}
}

// message converts a record, choosing its id.
func (s *Subscriber) message(r *kgo.Record) *consumer.Message {
	return inbound.Message(s.c, r.Value, r, r.Headers, func(h kgo.RecordHeader) (string, []byte) { return h.Key, h.Value },
		s.cfg.IDHeader, s.cfg.FallbackOnInvalidID, func() string { return FallbackID(r) }, nil)
}
