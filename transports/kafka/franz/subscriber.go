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
	// Retry shapes the backoff (full jitter) before held records (a Retry
	// outcome and the records behind it) are processed again when the
	// consumer gave no RetryAfter (a database outage). Defaults to
	// [RetryDefault].
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
// Retry outcome holds that record and the ones behind it, which are
// processed again in order after its RetryAfter or a backoff (while the
// database is down: a capped, jittered backoff, no new poll, and one log
// line when it goes and one when it is back). Dead letters are produced
// to DeadLetterTopic in one batch per group, as the kafka-go Subscriber
// does, and the offset is committed up to the first that failed.
// Rebalances wait for the polled records to be processed and committed
// (kgo's BlockRebalanceOnPoll), so a revoked partition's next owner starts
// where this one stopped; held records too, so a database outage longer
// than the group's rebalance timeout may get this member evicted, and the
// next owner then applies the same records in the same order (the inbox
// drops what both apply).
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
	r := &run{s: s, cl: cl, kernel: inbound.New(inbound.Config{Retry: s.cfg.Retry, Logger: s.log})}
	process := r.kernel.Processor(s.c, s.cfg.Batch)
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
				workCtx, cancel := lifecycle.Grace(ctx, s.cfg.ShutdownGrace)
				defer cancel()
				// MaxBatch records at a time, in order; held ones wait in
				// place (the next poll waits for them), and after a
				// shutdown or a crash the rest is dropped uncommitted.
				for recs := p.Records; len(recs) > 0 && r.crash() == nil; {
					n := min(len(recs), s.cfg.MaxBatch)
					msgs := make([]*consumer.Message, n)
					for i, rec := range recs[:n] {
						msgs[i] = s.message(rec)
					}
					if r.kernel.Group(ctx, workCtx, msgs, process, r) != nil {
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

// run is the state of one Run, shared by the partitions of a poll, and
// the franz-go half of their settling (an inbound.Client).
type run struct {
	s      *Subscriber
	cl     *kgo.Client
	kernel *inbound.Kernel

	mu       sync.Mutex
	crashErr error
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

// DeadLetter produces the copies of the dead letters among msgs in one
// batch; it reports how many leading ones reached the topic.
func (r *run) DeadLetter(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, dead []int) (int, error) {
	if r.s.cfg.DeadLetterTopic == "" {
		return len(dead), nil
	}
	copies := make([]*kgo.Record, len(dead))
	for j, i := range dead {
		copies[j] = r.s.deadLetter(msgs[i], results[i])
	}
	for j, pr := range r.cl.ProduceSync(ctx, copies...) {
		if pr.Err != nil {
			return j, fmt.Errorf("idemq/franz: publish dead letter to %s: %w", r.s.cfg.DeadLetterTopic, pr.Err)
		}
	}
	return len(dead), nil
}

// Settle commits the offset after msgs, which all settled. It returns the
// error of a Test.BeforeCommit veto, after which nothing more is
// committed.
func (r *run) Settle(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, _ []inbound.Step) error {
	if hook := r.s.cfg.Test.BeforeCommit; hook != nil {
		if err := hook(ctx, msgs, results); err != nil {
			r.crashed(err)
		}
	}
	if err := r.crash(); err != nil {
		return err
	}
	last, _ := Source(msgs[len(msgs)-1])
	if err := r.cl.CommitRecords(ctx, last); err != nil {
		// The work is durable; a redelivery is deduplicated.
		r.s.log.WarnContext(ctx, "commit offset", slog.String("record", FallbackID(last)), slog.Any("error", err))
	}
	return nil
}

// Release does nothing: the offset is not committed past held records.
func (r *run) Release([]*consumer.Message) {}

// deadLetter is the copy of msg, a dead letter or a conflict, for
// DeadLetterTopic.
func (s *Subscriber) deadLetter(msg *consumer.Message, res consumer.Result) *kgo.Record {
	r, _ := Source(msg)
	return &kgo.Record{Topic: s.cfg.DeadLetterTopic, Key: r.Key, Value: r.Value,
		Headers: inbound.DeadLetterRecord(r.Headers, s.cfg.IDHeader, FallbackID(r), res)}
}

// message converts a record, choosing its id.
func (s *Subscriber) message(r *kgo.Record) *consumer.Message {
	return inbound.Record(inbound.IDs{Consumer: s.c, Header: s.cfg.IDHeader, FallbackOnInvalid: s.cfg.FallbackOnInvalidID},
		r.Value, r.Headers, r, func() string { return FallbackID(r) })
}
