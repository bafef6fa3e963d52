package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/transports/internal/inbound"
)

// HeaderDeadLetterID is the original message's id on the copy a
// [JetStreamSubscriber] publishes to its dead-letter subject, beside the
// consumer.HeaderDeadLetter* headers. The copy's Nats-Msg-Id is its own,
// "dead-letter/stream/sequence".
const HeaderDeadLetterID = "Idemq-Dead-Letter-Id"

// ackTimeout bounds the wait for an acknowledgement's confirmation.
const ackTimeout = 5 * time.Second

// errCrash marks Run's error after a Test.BeforeAck veto.
var errCrash = errors.New("idemq/nats: acknowledgement vetoed by Test.BeforeAck")

// IDHeaderDefault is the header carrying a message id: the one JetStream
// deduplicates publishes by, which the Sinks of this package set to the
// outbox id.
const IDHeaderDefault = jetstream.MsgIDHeader

// The defaults of [JetStreamSubscriberConfig] and [CoreSubscriberConfig].
const (
	MaxBatchDefault      = 100
	FetchWaitDefault     = 500 * time.Millisecond
	ShutdownGraceDefault = 30 * time.Second
)

// RetryDefault is the default [JetStreamSubscriberConfig.Retry].
var RetryDefault = idemq.Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: 5 * time.Second}

// JetStreamSubscriberConfig configures a [JetStreamSubscriber]. The zero
// value is ready to use.
type JetStreamSubscriberConfig struct {
	// IDHeader names the header carrying the message id. A message without
	// it gets [FallbackID], "stream/sequence": unique per stored message, so
	// a redelivery is recognised, but a producer's retry stored twice
	// (outside the stream's duplicate window) is not. Defaults to
	// [IDHeaderDefault].
	IDHeader string
	// FallbackOnInvalidID gives a message whose id header is present but
	// unusable as a key (empty, over the key limit, not valid UTF-8, with
	// NUL) the "stream/sequence" id instead, and processes it. Defaults to
	// false: the consumer dead-letters the message with
	// consumer.ErrInvalidMessage (published to DeadLetterSubject if set,
	// then terminated), so a producer bug is seen rather than
	// half-deduplicated. Either way the stream moves on.
	FallbackOnInvalidID bool

	// Batch applies every fetched batch with consumer.ProcessBatch (one
	// transaction, a savepoint per message where a handler fails), then
	// acknowledges it; a consumer made by consumer.NewBatched gets the
	// batch's new messages in one call of its batch handler.
	// Defaults to false: consumer.Process, one transaction per message,
	// each acknowledged after its commit.
	Batch bool
	// MaxBatch bounds the messages one fetch asks for; at most the
	// JetStream consumer's MaxRequestBatch, if it has one. Defaults to
	// [MaxBatchDefault].
	MaxBatch int
	// FetchWait bounds how long one fetch waits for MaxBatch messages; it
	// is also how long Run may take to notice a cancelled context while
	// the stream is idle. At least 1ms. Defaults to [FetchWaitDefault].
	FetchWait time.Duration

	// InProgressInterval is how often the messages fetched and not yet
	// acknowledged are reported in progress (jetstream.Msg.InProgress),
	// which restarts their AckWait, so a long handler never makes the
	// server deliver its message again in parallel. It must be below
	// AckWait, and at least 1ms. Defaults to a third of the consumer's
	// AckWait.
	InProgressInterval time.Duration

	// DeadLetterSubject, if set, receives a copy of every dead letter and
	// conflict (payload, headers, the consumer.HeaderDeadLetter* headers, the
	// message id in [HeaderDeadLetterID]), published through JetStream (a
	// stream must capture the subject; it may be the input's own) before
	// the message is terminated. If the publish fails the message is not
	// terminated but held, with the messages behind it, and published
	// again after a backoff: at least once, and the copy's Nats-Msg-Id,
	// "dead-letter/stream/sequence", lets the stream drop the repeats.
	DeadLetterSubject string

	// ShutdownGrace bounds the time Run spends, after ctx is cancelled,
	// finishing and acknowledging the messages already fetched; then their
	// processing is cancelled (their outcome is Retry, they are redelivered
	// later). Defaults to [ShutdownGraceDefault].
	ShutdownGrace time.Duration
	// Retry shapes the backoff with full jitter between fetches that failed
	// (server restarting, connection lost) and before held messages (a
	// database outage, a dead letter whose copy could not be published)
	// are processed again. Only BaseDelay and
	// MaxDelay apply: the consumer counts attempts. Defaults to
	// [RetryDefault].
	Retry idemq.Retry
	// Logger receives fetch errors and ack failures. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Test holds crash points for tests; leave it zero in production.
	Test TestConfig
}

// TestConfig holds a subscriber's crash points, for tests and chaos
// drills.
type TestConfig struct {
	// BeforeAck, if set, is called with the messages and their results
	// after they were processed and before any of them is acknowledged. A
	// non-nil error stops Run at once without acknowledging anything more
	// (Run returns it wrapped), as a killed process would. Core NATS has no
	// acknowledgement: there it only stops Run.
	BeforeAck func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error
}

// JetStreamSubscriber applies the messages of a JetStream pull consumer
// through a consumer.Consumer, effectively once:
//
//   - a message is acknowledged only after the transaction that applied it
//     committed, or after the consumer recognised it as a duplicate; the
//     last acknowledgement of every fetched batch (in per-message mode:
//     every one) waits for the server's confirmation, which confirms the
//     earlier ones, so a graceful stop leaves nothing unacknowledged;
//   - a handler failure that the consumer hands back (its
//     consumer.Config.Redeliver mode) is NakWithDelay(Result.RetryAfter):
//     the server redelivers it later, and the messages behind it go first;
//   - any other Retry outcome holds the message and the ones fetched
//     behind it, in progress, and processes them again in order after its
//     RetryAfter or a capped, jittered backoff, so no message of a key
//     overtakes an earlier one: a database outage
//     (consumer.Result.Unavailable), during which nothing is fetched and
//     the log says once that the database is gone and once that it is
//     back, with the count of the messages that waited; a key another
//     worker holds; a shutdown, after which held messages are Nak'ed;
//   - a Conflict or DeadLettered outcome is copied to
//     [JetStreamSubscriberConfig.DeadLetterSubject] if set, then terminated;
//   - every fetched message not yet acknowledged is reported in progress
//     at [JetStreamSubscriberConfig.InProgressInterval], so AckWait never
//     expires under a long handler or a long batch.
//
// Messages are processed one fetched batch at a time, in stream order.
// consumer.Message.Headers holds the first value of each header; all of
// them, the subject and the metadata are on the jetstream.Msg in
// Message.Source ([JetStreamSource]).
//
// A JetStreamSubscriber is an idemq.Service: one Run at a time, and Run
// may be called again after it returned.
type JetStreamSubscriber struct {
	c     *consumer.Consumer
	cons  jetstream.Consumer
	cfg   JetStreamSubscriberConfig
	js    jetstream.JetStream // for dead letters
	log   *slog.Logger
	state lifecycle.State
}

// NewJetStreamSubscriber returns a subscriber applying the messages of
// cons (a pull consumer with explicit acknowledgements) through c. js is
// used only to publish dead letters and may be nil without
// DeadLetterSubject.
//
// Leave the JetStream consumer's MaxDeliver unlimited (-1, the default):
// the idemq consumer's attempts decide when a message becomes a dead
// letter, while a message exceeding MaxDeliver would be dropped by the
// server without one.
func NewJetStreamSubscriber(c *consumer.Consumer, cons jetstream.Consumer, js jetstream.JetStream, cfg JetStreamSubscriberConfig) (*JetStreamSubscriber, error) {
	const component = "nats.JetStreamSubscriber"
	switch {
	case c == nil:
		return nil, idemq.NewConfigError(component, "consumer", "is nil")
	case nilcheck.IsNil(cons):
		return nil, idemq.NewConfigError(component, "cons", "is nil")
	}
	info := cons.CachedInfo()
	switch {
	case info == nil:
		return nil, idemq.NewConfigError(component, "cons", "the JetStream consumer has no info")
	case info.Config.AckPolicy != jetstream.AckExplicitPolicy:
		return nil, idemq.NewConfigError(component, "cons", "consumer %s has AckPolicy %v; idemq needs AckExplicitPolicy", info.Name, info.Config.AckPolicy)
	case cfg.DeadLetterSubject != "" && nilcheck.IsNil(js):
		return nil, idemq.NewConfigError(component, "DeadLetterSubject", "needs a JetStream to publish with (js is nil)")
	}
	ackWait := cmp.Or(info.Config.AckWait, 30*time.Second) // the server's default
	cfg = cfg.withDefaults(ackWait)
	if err := cfg.validate(component, ackWait); err != nil {
		return nil, err
	}
	if most := info.Config.MaxRequestBatch; most > 0 && cfg.MaxBatch > most {
		// The server would refuse every fetch, and Run retry it forever.
		return nil, idemq.NewConfigError(component, "MaxBatch", "%d is above the JetStream consumer's MaxRequestBatch %d: set MaxBatch to at most %d",
			cfg.MaxBatch, most, most)
	}
	s := &JetStreamSubscriber{
		c: c, cons: cons, cfg: cfg, js: js,
		log: cfg.Logger.With(slog.String("stream", info.Stream), slog.String("consumer", info.Name), slog.String("scope", c.Scope())),
	}
	if md := info.Config.MaxDeliver; md > 0 {
		s.log.Warn("idemq/nats: the JetStream consumer's MaxDeliver drops a message without a dead letter after that many deliveries; leave it unlimited (-1)", slog.Int("max_deliver", md))
	}
	return s, nil
}

func (c JetStreamSubscriberConfig) withDefaults(ackWait time.Duration) JetStreamSubscriberConfig {
	c.IDHeader = cmp.Or(c.IDHeader, IDHeaderDefault)
	c.MaxBatch = cmp.Or(c.MaxBatch, MaxBatchDefault)
	c.FetchWait = cmp.Or(c.FetchWait, FetchWaitDefault)
	c.InProgressInterval = cmp.Or(c.InProgressInterval, ackWait/3)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

func (c JetStreamSubscriberConfig) validate(component string, ackWait time.Duration) error {
	if err := checkHeaderName(component, "IDHeader", c.IDHeader); err != nil {
		return err
	}
	if c.DeadLetterSubject != "" {
		if err := checkSubject(component, "DeadLetterSubject", c.DeadLetterSubject, false); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"FetchWait", c.FetchWait}, {"InProgressInterval", c.InProgressInterval}} {
		if err := checkDuration(component, d.name, d.v); err != nil {
			return err
		}
	}
	switch {
	case c.MaxBatch < 0:
		return idemq.NewConfigError(component, "MaxBatch", "%d is negative", c.MaxBatch)
	case c.InProgressInterval >= ackWait:
		return idemq.NewConfigError(component, "InProgressInterval", "%v must be positive and below the consumer's AckWait %v", c.InProgressInterval, ackWait)
	case c.ShutdownGrace < 0:
		return idemq.NewConfigError(component, "ShutdownGrace", "%v is negative", c.ShutdownGrace)
	}
	return c.Retry.Validate(component)
}

// Ready is closed once Run has sent its first fetch request.
func (s *JetStreamSubscriber) Ready() <-chan struct{} { return s.state.Ready() }

// Run fetches and applies messages until ctx is cancelled, then finishes
// and acknowledges what it already fetched (within ShutdownGrace) and
// returns nil. Fetch failures (a server restarting, a lost connection) are
// logged and retried with backoff; Run returns an error when the
// JetStream consumer was deleted, the connection was closed, a
// Test.BeforeAck hook vetoed, or ([idemq.ErrRunning]) another Run is
// active.
func (s *JetStreamSubscriber) Run(ctx context.Context) error {
	ready, end, err := s.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	// Processing outlives ctx by at most ShutdownGrace, so that what was
	// fetched is finished and acknowledged rather than abandoned.
	pctx, cancel := lifecycle.Grace(ctx, s.cfg.ShutdownGrace)
	defer cancel()

	// The loop runs on after a success, so it takes the delays of a
	// BackOff rather than running under backoff.RetryNotify: Retry's
	// delays without its bounds, since fetching never gives up.
	back := idemq.Retry{BaseDelay: s.cfg.Retry.BaseDelay, MaxDelay: s.cfg.Retry.MaxDelay}.BackOff()
	k := inbound.New(inbound.Config{Retry: s.cfg.Retry, Redeliver: true, Logger: s.log})
	process := k.Processor(s.c, s.cfg.Batch)
	for ctx.Err() == nil {
		batch, err := s.cons.Fetch(s.cfg.MaxBatch, jetstream.FetchMaxWait(s.cfg.FetchWait))
		if err == nil {
			ready()
			err = s.handle(ctx, pctx, batch, k, process)
		}
		switch {
		case err == nil:
			back.Reset()
			continue
		case errors.Is(err, errCrash):
			return err
		case ctx.Err() != nil:
			return nil // stopped while messages were held; they were handed back
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
			errors.Is(err, nats.ErrConnectionClosed):
			return fmt.Errorf("idemq/nats: fetch: %w", err)
		}
		delay := back.NextBackOff()
		s.log.Warn("idemq/nats: fetch failed; retrying", slog.Any("error", err), slog.Duration("delay", delay))
		_ = lifecycle.Sleep(ctx, delay)
	}
	return nil
}

// handle processes one fetched batch, holding messages in place (in
// progress) while the kernel holds them. It returns the batch's fetch
// error (after processing what arrived), an errCrash, or ctx's error when
// Run stopped with messages held (those are handed back).
func (s *JetStreamSubscriber) handle(ctx, pctx context.Context, batch jetstream.MessageBatch, k *inbound.Kernel, process inbound.Process) error {
	live := newInProgress(s.cfg.InProgressInterval)
	defer live.stop()
	cl := &jsClient{s: s, live: live}
	if s.cfg.Batch {
		var msgs []*consumer.Message
		for raw := range batch.Messages() {
			live.add(raw)
			msgs = append(msgs, s.message(raw))
		}
		if len(msgs) > 0 {
			if err := k.Group(ctx, pctx, msgs, process, cl); err != nil {
				return err
			}
		}
		return batch.Error()
	}
	var stopped error
	for raw := range batch.Messages() {
		live.add(raw)
		switch {
		case errors.Is(stopped, errCrash):
			continue // a killed process would not see the rest
		case stopped != nil:
			cl.handBack(raw) // behind a held one: back to the server, in order
			continue
		}
		stopped = k.Group(ctx, pctx, []*consumer.Message{s.message(raw)}, process, cl)
	}
	if stopped != nil {
		return stopped
	}
	return batch.Error()
}

// jsClient is the JetStream half of settling a fetched batch (an
// inbound.Client).
type jsClient struct {
	s    *JetStreamSubscriber
	live *inProgress
}

// DeadLetter publishes the copies of the dead letters among msgs, one by
// one; it reports how many leading ones the stream stored.
func (c *jsClient) DeadLetter(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, dead []int) (int, error) {
	for j, i := range dead {
		raw, _ := JetStreamSource(msgs[i])
		if err := c.s.deadLetter(ctx, raw, msgs[i], results[i]); err != nil {
			return j, fmt.Errorf("idemq/nats: publish dead letter to %s: %w", c.s.cfg.DeadLetterSubject, err)
		}
	}
	return len(dead), nil
}

// Settle acknowledges, naks or terminates processed messages.
func (c *jsClient) Settle(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, steps []inbound.Step) error {
	if hook := c.s.cfg.Test.BeforeAck; hook != nil {
		if err := hook(ctx, msgs, results); err != nil {
			c.live.stop()
			return fmt.Errorf("%w: %w", errCrash, err)
		}
	}
	// Acks go out without waiting, except the last one: JetStream
	// processes a consumer's acks in order, so its confirmation confirms
	// the earlier ones too.
	confirm := -1
	for i, st := range steps {
		if st.Action == inbound.Ack {
			confirm = i
		}
	}
	for i, st := range steps {
		raw, _ := JetStreamSource(msgs[i])
		c.live.done(raw) // no InProgress after the settlement
		var err error
		switch st.Action {
		case inbound.Ack:
			if i == confirm {
				actx, cancel := context.WithTimeout(ctx, ackTimeout)
				err = raw.DoubleAck(actx)
				cancel()
			} else {
				err = raw.Ack()
			}
		case inbound.Redeliver:
			err = raw.NakWithDelay(st.Delay)
		default: // DeadLetter, its copy published
			// Term, not TermWithReason: servers before 2.10.4 ignore the
			// latter and redeliver. The reason is in the inbox record and
			// the dead-letter copy.
			err = raw.Term()
		}
		if err != nil {
			// The server redelivers it after AckWait; the inbox makes that
			// a Duplicate.
			c.s.log.Warn("idemq/nats: settle message", slog.String("key", results[i].Key), slog.String("outcome", results[i].Outcome.String()), slog.Any("error", err))
		}
	}
	return nil
}

// Release hands held messages back to the server at once, in order.
func (c *jsClient) Release(msgs []*consumer.Message) {
	for _, m := range msgs {
		raw, _ := JetStreamSource(m)
		c.handBack(raw)
	}
}

func (c *jsClient) handBack(raw jetstream.Msg) {
	c.live.done(raw)
	_ = raw.Nak()
}

func (s *JetStreamSubscriber) deadLetter(ctx context.Context, raw jetstream.Msg, msg *consumer.Message, r consumer.Result) error {
	if s.cfg.DeadLetterSubject == "" {
		return nil
	}
	out := nats.NewMsg(s.cfg.DeadLetterSubject)
	out.Data = raw.Data()
	for k, v := range raw.Headers() {
		out.Header[k] = v
	}
	source := raw.Subject()
	if md, err := raw.Metadata(); err == nil {
		source += " " + md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	out.Header.Set(consumer.HeaderDeadLetterReason, errtext.Of(r.Err))
	out.Header.Set(consumer.HeaderDeadLetterOutcome, r.Outcome.String())
	out.Header.Set(consumer.HeaderDeadLetterSource, source)
	if id := errtext.Truncate(msg.ID, errtext.MaxLen); id != "" {
		out.Header.Set(HeaderDeadLetterID, id)
	}
	// The copy has its own id: with the original's, a stream capturing both
	// subjects would drop the copy as a duplicate of the original. The
	// original's stream position is unique per stored message and the same
	// on every redelivery, so the copies a failed Term leads to are dropped.
	out.Header.Set(jetstream.MsgIDHeader, "dead-letter/"+FallbackID(raw))
	_, err := s.js.PublishMsg(ctx, out)
	return err
}

// message turns a JetStream message into a consumer.Message.
func (s *JetStreamSubscriber) message(raw jetstream.Msg) *consumer.Message {
	msg := &consumer.Message{Payload: raw.Data(), Headers: flatten(raw.Headers()), Source: raw}
	if msg.Payload == nil {
		msg.Payload = []byte{} // an empty message is a valid message
	}
	if md, err := raw.Metadata(); err == nil {
		msg.Delivery = int(md.NumDelivered)
	}
	var id string
	vals, found := raw.Headers()[s.cfg.IDHeader]
	if found && len(vals) > 0 {
		id = vals[0]
	}
	ids := inbound.IDs{Consumer: s.c, Header: s.cfg.IDHeader, FallbackOnInvalid: s.cfg.FallbackOnInvalidID}
	msg.ID = ids.Choose(id, found, func() string { return FallbackID(raw) })
	return msg
}

// FallbackID returns the id of a JetStream message without an id header:
// "stream/sequence" (the stream sequence, unique and stable across
// redeliveries). It returns "" for a message without JetStream metadata.
func FallbackID(raw jetstream.Msg) string {
	md, err := raw.Metadata()
	if err != nil {
		return ""
	}
	return md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// JetStreamSource returns the JetStream message msg was made from (its
// subject, metadata, reply), if it came from a [JetStreamSubscriber].
func JetStreamSource(msg *consumer.Message) (jetstream.Msg, bool) {
	raw, ok := msg.Source.(jetstream.Msg)
	return raw, ok
}

// Subject returns the subject msg was published to, for messages from a
// [JetStreamSubscriber] or a [CoreSubscriber]; "" otherwise.
func Subject(msg *consumer.Message) string {
	switch raw := msg.Source.(type) {
	case jetstream.Msg:
		return raw.Subject()
	case *nats.Msg:
		return raw.Subject
	}
	return ""
}

// inProgress reports fetched, unsettled messages in progress every
// interval, on lifecycle.KeepAlive.
type inProgress struct {
	mu      sync.Mutex
	pending map[jetstream.Msg]struct{}
	halt    func() error
}

func newInProgress(interval time.Duration) *inProgress {
	p := &inProgress{pending: map[jetstream.Msg]struct{}{}}
	p.halt = lifecycle.KeepAlive(context.Background(), interval, func(context.Context) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		for m := range p.pending {
			_ = m.InProgress()
		}
		return nil
	})
	return p
}

func (p *inProgress) add(m jetstream.Msg) {
	p.mu.Lock()
	p.pending[m] = struct{}{}
	p.mu.Unlock()
}

func (p *inProgress) done(m jetstream.Msg) {
	p.mu.Lock()
	delete(p.pending, m)
	p.mu.Unlock()
}

// stop ends the reports and waits for the one in flight; safe to call
// more than once.
func (p *inProgress) stop() { _ = p.halt() }

func flatten(h nats.Header) map[string]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}
