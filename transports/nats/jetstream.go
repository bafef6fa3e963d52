package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/retry"
)

// Dead-letter headers a subscriber adds to a message it publishes to its
// dead-letter subject.
const (
	// HeaderDeadLetterReason carries the error that made the message a
	// dead letter or a conflict.
	HeaderDeadLetterReason = "Idemq-Dead-Letter-Reason"
	// HeaderDeadLetterOutcome is "dead-lettered" or "conflict" (the
	// consumer.Outcome's String).
	HeaderDeadLetterOutcome = "Idemq-Dead-Letter-Outcome"
	// HeaderDeadLetterSource is the original subject, and for JetStream
	// the original "stream/sequence".
	HeaderDeadLetterSource = "Idemq-Dead-Letter-Source"
)

// ackTimeout bounds the wait for an acknowledgement's confirmation.
const ackTimeout = 5 * time.Second

// ErrCrash is returned (wrapped) by Run when a BeforeAck hook vetoed the
// acknowledgements: the subscriber stopped without acknowledging anything
// more, as a killed process would.
var ErrCrash = errors.New("idemq/nats: acknowledgement vetoed by BeforeAck")

// JetStreamConfig configures a [JetStreamSubscriber]. The zero value is
// ready to use.
type JetStreamConfig struct {
	// IDHeader names the header carrying the message id. Defaults to
	// "Nats-Msg-Id", the header JetStream deduplicates publishes by and the
	// Sinks of this package set to the outbox id. A message without it gets
	// [JetStreamFallbackID], "stream/sequence": unique per stored message,
	// so a redelivery is recognised, but a producer's retry stored twice
	// (outside the stream's duplicate window) is not.
	IDHeader string
	// FallbackOnInvalidID gives a message whose id header is present but
	// unusable as a key (inbox.Store.Validate rejects it: empty, over the
	// key limit, not valid UTF-8, with NUL) the
	// "stream/sequence" id instead, and processes it. Defaults to false:
	// the header is passed through unchanged and the consumer dead-letters
	// the message with consumer.ErrInvalidMessage (published to
	// DeadLetterSubject if set, then terminated), so a producer bug is seen
	// rather than half-deduplicated. Either way the stream moves on.
	FallbackOnInvalidID bool

	// Batch applies every fetched batch with consumer.ProcessBatch (one
	// transaction, a savepoint per message), then acknowledges it.
	// Defaults to false: consumer.Process, one transaction per message,
	// each acknowledged after its commit.
	Batch bool
	// MaxBatch bounds the messages one fetch asks for. Defaults to 100.
	MaxBatch int
	// FetchWait bounds how long one fetch waits for MaxBatch messages; it
	// is also how long Run may take to notice a cancelled context while
	// the stream is idle. Defaults to 500 ms.
	FetchWait time.Duration

	// InProgressInterval is how often the messages fetched and not yet
	// acknowledged are reported in progress (jetstream.Msg.InProgress),
	// which restarts their AckWait, so a long handler never makes the
	// server deliver its message again in parallel. Defaults to a third of
	// the consumer's AckWait; it must be below AckWait.
	InProgressInterval time.Duration

	// DeadLetterSubject, if set, receives a copy of every dead letter and
	// conflict (payload, headers, the Idemq-Dead-Letter-* headers and the
	// message id in Nats-Msg-Id), published through JetStream (a stream
	// must capture the subject) before the message is terminated. If the
	// publish fails the message is not terminated but redelivered, and
	// published again: at least once, and the id lets a stream drop the
	// copies.
	DeadLetterSubject string

	// BeforeAck, if set, is called with the messages and their results
	// after they were processed and before any of them is acknowledged. A
	// non-nil error stops Run at once without acknowledging anything more
	// (Run returns it wrapped in [ErrCrash]). It exists to simulate a crash
	// between the database commit and the ack in tests and demos.
	BeforeAck func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error

	// ShutdownTimeout bounds the time Run spends, after ctx is cancelled,
	// finishing and acknowledging the messages already fetched; then their
	// processing is cancelled (their outcome is Retry, they are redelivered
	// later). Defaults to 30 seconds.
	ShutdownTimeout time.Duration
	// RetryBaseDelay and RetryMaxDelay shape the backoff with full jitter
	// between fetches that failed (server restarting, connection lost).
	// Default to 100 ms and 5 s.
	RetryBaseDelay, RetryMaxDelay time.Duration
	// Logger receives fetch errors and ack failures. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// JetStreamSubscriber applies the messages of a JetStream pull consumer
// through a consumer.Consumer, effectively once:
//
//   - a message is acknowledged only after the transaction that applied it
//     committed, or after the consumer recognised it as a duplicate; the
//     last acknowledgement of every fetched batch (in per-message mode:
//     every one) waits for the server's confirmation, which confirms the
//     earlier ones, so a graceful stop leaves nothing unacknowledged;
//   - a Retry outcome is NakWithDelay(Result.RetryAfter): the server
//     redelivers it later (set consumer.Config.Redeliver so the consumer
//     counts attempts by the delivery count instead of retrying in place);
//   - a Conflict or DeadLettered outcome is copied to
//     [JetStreamConfig.DeadLetterSubject] if set, then terminated;
//   - every fetched message not yet acknowledged is reported in progress
//     at [JetStreamConfig.InProgressInterval], so AckWait never expires
//     under a long handler or a long batch.
//
// Messages are processed one fetched batch at a time, in stream order.
// consumer.Message.Headers holds the first value of each header; all of
// them, the subject and the metadata are on the jetstream.Msg in
// Message.Source ([JetStreamMsg]). A JetStreamSubscriber runs once: call
// Run.
type JetStreamSubscriber struct {
	c         *consumer.Consumer
	cons      jetstream.Consumer
	cfg       JetStreamConfig
	js        jetstream.JetStream // for dead letters
	log       *slog.Logger
	policy    retry.Policy
	maxKeyLen int

	crashMu sync.Mutex
	crash   error
}

// NewJetStreamSubscriber returns a subscriber applying the messages of
// cons (a pull consumer with explicit acknowledgements) through c. js is
// used only to publish dead letters and may be nil without
// DeadLetterSubject.
//
// Leave the JetStream consumer's MaxDeliver unlimited (-1, the default):
// the idemq consumer's MaxAttempts decides when a message becomes a dead
// letter, while a message exceeding MaxDeliver would be dropped by the
// server without one.
func NewJetStreamSubscriber(c *consumer.Consumer, cons jetstream.Consumer, js jetstream.JetStream, cfg JetStreamConfig) (*JetStreamSubscriber, error) {
	if c == nil || cons == nil {
		return nil, fmt.Errorf("%w: nil consumer", ErrConfig)
	}
	info := cons.CachedInfo()
	if info == nil {
		return nil, fmt.Errorf("%w: the JetStream consumer has no info", ErrConfig)
	}
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: consumer %s has AckPolicy %v; idemq needs AckExplicitPolicy", ErrConfig, info.Name, info.Config.AckPolicy)
	}
	if cfg.DeadLetterSubject != "" && js == nil {
		return nil, fmt.Errorf("%w: DeadLetterSubject needs a JetStream to publish with", ErrConfig)
	}
	if cfg.MaxBatch < 0 || cfg.FetchWait < 0 || cfg.InProgressInterval < 0 || cfg.ShutdownTimeout < 0 ||
		cfg.RetryBaseDelay < 0 || cfg.RetryMaxDelay < 0 {
		return nil, fmt.Errorf("%w: durations and MaxBatch must not be negative", ErrConfig)
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = jetstream.MsgIDHeader
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 100
	}
	if cfg.FetchWait == 0 {
		cfg.FetchWait = 500 * time.Millisecond
	}
	ackWait := info.Config.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second // the server's default
	}
	if cfg.InProgressInterval == 0 {
		cfg.InProgressInterval = ackWait / 3
	}
	if cfg.InProgressInterval >= ackWait {
		return nil, fmt.Errorf("%w: InProgressInterval %v must be below the consumer's AckWait %v", ErrConfig, cfg.InProgressInterval, ackWait)
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.RetryBaseDelay == 0 {
		cfg.RetryBaseDelay = 100 * time.Millisecond
	}
	if cfg.RetryMaxDelay == 0 {
		cfg.RetryMaxDelay = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &JetStreamSubscriber{
		c: c, cons: cons, cfg: cfg, js: js,
		log:       cfg.Logger.With(slog.String("stream", info.Stream), slog.String("consumer", info.Name), slog.String("scope", c.Scope())),
		policy:    retry.Policy{Base: cfg.RetryBaseDelay, Cap: cfg.RetryMaxDelay},
		maxKeyLen: c.Store().Config().MaxKeyLen,
	}
	if md := info.Config.MaxDeliver; md > 0 {
		s.log.Warn("idemq/nats: the JetStream consumer's MaxDeliver drops a message without a dead letter after that many deliveries; leave it unlimited (-1)", slog.Int("max_deliver", md))
	}
	return s, nil
}

// Run fetches and applies messages until ctx is cancelled, then finishes
// and acknowledges what it already fetched (within ShutdownTimeout) and
// returns nil. Fetch failures (a server restarting, a lost connection) are
// logged and retried with backoff; Run returns an error only when the
// JetStream consumer was deleted, the connection was closed, or a
// BeforeAck hook vetoed (an error wrapping [ErrCrash]).
func (s *JetStreamSubscriber) Run(ctx context.Context) error {
	// Processing outlives ctx by at most ShutdownTimeout, so that what was
	// fetched is finished and acknowledged rather than abandoned.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		graceAfter(ctx, pctx, s.cfg.ShutdownTimeout, cancel)
	}()

	failures := 0
	for ctx.Err() == nil {
		batch, err := s.cons.Fetch(s.cfg.MaxBatch, jetstream.FetchMaxWait(s.cfg.FetchWait))
		if err == nil {
			err = s.handle(pctx, batch)
		}
		switch {
		case err == nil:
			failures = 0
			continue
		case errors.Is(err, ErrCrash):
			return err
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound),
			errors.Is(err, nats.ErrConnectionClosed):
			return fmt.Errorf("idemq/nats: fetch: %w", err)
		}
		failures++
		delay := s.policy.Delay(failures)
		s.log.Warn("idemq/nats: fetch failed; retrying", slog.Any("error", err), slog.Duration("delay", delay))
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	return nil
}

// handle processes one fetched batch. It returns the batch's fetch error
// (after processing what arrived) or an ErrCrash.
func (s *JetStreamSubscriber) handle(ctx context.Context, batch jetstream.MessageBatch) error {
	live := newInProgress(s.cfg.InProgressInterval)
	defer live.stop()
	if s.cfg.Batch {
		var raws []jetstream.Msg
		for raw := range batch.Messages() {
			live.add(raw)
			raws = append(raws, raw)
		}
		if len(raws) > 0 {
			msgs := make([]*consumer.Message, len(raws))
			for i, raw := range raws {
				msgs[i] = s.message(raw)
			}
			if err := s.settle(ctx, raws, msgs, s.c.ProcessBatch(ctx, msgs), live); err != nil {
				return err
			}
		}
		return batch.Error()
	}
	for raw := range batch.Messages() {
		live.add(raw)
		if s.crashed() {
			continue // a killed process would not see the rest
		}
		msg := s.message(raw)
		r := s.c.Process(ctx, msg)
		if err := s.settle(ctx, []jetstream.Msg{raw}, []*consumer.Message{msg}, []consumer.Result{r}, live); err != nil {
			s.setCrash(err)
		}
	}
	if err := s.getCrash(); err != nil {
		return err
	}
	return batch.Error()
}

// settle acknowledges, naks or terminates processed messages.
func (s *JetStreamSubscriber) settle(ctx context.Context, raws []jetstream.Msg, msgs []*consumer.Message, results []consumer.Result, live *inProgress) error {
	if s.cfg.BeforeAck != nil {
		if err := s.cfg.BeforeAck(ctx, msgs, results); err != nil {
			live.stop()
			return fmt.Errorf("%w: %w", ErrCrash, err)
		}
	}
	// Acks go out without waiting, except the batch's last one: JetStream
	// processes a consumer's acks in order, so its confirmation confirms
	// the earlier ones too.
	confirm := -1
	for i, r := range results {
		if r.Outcome == consumer.Applied || r.Outcome == consumer.Duplicate {
			confirm = i
		}
	}
	for i, raw := range raws {
		live.done(raw) // no InProgress after the settlement
		r := results[i]
		var err error
		switch r.Outcome {
		case consumer.Applied, consumer.Duplicate:
			if i == confirm {
				actx, cancel := context.WithTimeout(ctx, ackTimeout)
				err = raw.DoubleAck(actx)
				cancel()
			} else {
				err = raw.Ack()
			}
		case consumer.Retry:
			err = raw.NakWithDelay(r.RetryAfter)
		default: // Conflict, DeadLettered
			if err = s.deadLetter(ctx, raw, msgs[i], r); err != nil {
				s.log.Error("idemq/nats: publish dead letter; the message will be redelivered", slog.String("key", r.Key), slog.Any("error", err))
				err = raw.NakWithDelay(s.policy.Delay(max(1, msgs[i].Delivery)))
				break
			}
			// Term, not TermWithReason: servers before 2.10.4 ignore the
			// latter and redeliver. The reason is in the inbox record and
			// the dead-letter copy.
			err = raw.Term()
		}
		if err != nil {
			// The server redelivers it after AckWait; the inbox makes that
			// a Duplicate.
			s.log.Warn("idemq/nats: settle message", slog.String("key", r.Key), slog.String("outcome", r.Outcome.String()), slog.Any("error", err))
		}
	}
	return nil
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
	out.Header.Set(HeaderDeadLetterReason, truncate(errString(r.Err), 1024))
	out.Header.Set(HeaderDeadLetterOutcome, r.Outcome.String())
	out.Header.Set(HeaderDeadLetterSource, source)
	if id := truncate(msg.ID, s.maxKeyLen); id != "" {
		out.Header.Set(jetstream.MsgIDHeader, id)
	}
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
	vals, found := raw.Headers()[s.cfg.IDHeader]
	if found && len(vals) > 0 {
		msg.ID = vals[0]
	}
	if !found || (s.cfg.FallbackOnInvalidID && s.c.Store().Validate(msg.ID, nil) != nil) {
		msg.ID = JetStreamFallbackID(raw)
	}
	return msg
}

func (s *JetStreamSubscriber) setCrash(err error) {
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	if s.crash == nil {
		s.crash = err
	}
}

func (s *JetStreamSubscriber) getCrash() error {
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	return s.crash
}

func (s *JetStreamSubscriber) crashed() bool { return s.getCrash() != nil }

// graceAfter calls cancel ShutdownTimeout after ctx ended, unless pctx
// ends first.
func graceAfter(ctx, pctx context.Context, timeout time.Duration, cancel context.CancelFunc) {
	select {
	case <-pctx.Done():
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-t.C:
		cancel()
	case <-pctx.Done():
	}
}

// JetStreamFallbackID returns the id of a JetStream message without an id
// header: "stream/sequence" (the stream sequence, unique and stable across
// redeliveries). It returns "" for a message without JetStream metadata.
func JetStreamFallbackID(raw jetstream.Msg) string {
	md, err := raw.Metadata()
	if err != nil {
		return ""
	}
	return md.Stream + "/" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// JetStreamMsg returns the JetStream message msg was made from (its
// subject, metadata, reply), if it came from a [JetStreamSubscriber].
func JetStreamMsg(msg *consumer.Message) (jetstream.Msg, bool) {
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

// inProgress reports fetched, unsettled messages in progress on a ticker.
type inProgress struct {
	mu      sync.Mutex
	pending map[jetstream.Msg]struct{}
	quit    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

func newInProgress(interval time.Duration) *inProgress {
	p := &inProgress{pending: map[jetstream.Msg]struct{}{}, quit: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
				p.mu.Lock()
				for m := range p.pending {
					_ = m.InProgress()
				}
				p.mu.Unlock()
			}
		}
	}()
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

// stop ends the ticker and waits for it; safe to call more than once.
func (p *inProgress) stop() {
	p.once.Do(func() { close(p.quit) })
	p.wg.Wait()
}

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

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
