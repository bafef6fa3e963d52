package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/transports/internal/inbound"
)

// CoreSubscriberConfig configures a [CoreSubscriber]. The zero value is
// ready to use.
type CoreSubscriberConfig struct {
	// Queue, if set, joins the queue group of that name: the subscribers
	// of one group share the subject's messages.
	Queue string
	// IDHeader names the header carrying the message id. Core NATS has no
	// sequence to fall back on: a message without the header gets the id ""
	// and the consumer dead-letters it with consumer.ErrInvalidMessage,
	// unless the consumer derives its key from the payload
	// (consumer.Config.KeyFunc). Defaults to [IDHeaderDefault].
	IDHeader string
	// ShutdownGrace bounds the time Run spends, after ctx is cancelled,
	// draining the subscription and applying what it had received.
	// Defaults to [ShutdownGraceDefault].
	ShutdownGrace time.Duration
	// Retry shapes the backoff with full jitter before a held message (a
	// database outage) is processed again. Only BaseDelay and MaxDelay
	// apply. Defaults to [RetryDefault].
	Retry idemq.Retry
	// Logger receives the database's outages and the messages lost on
	// core NATS (held when Run stopped). Defaults to slog.Default().
	Logger *slog.Logger

	// Test holds crash points for tests; leave it zero in production.
	Test TestConfig
}

// CoreSubscriber applies the messages of a core NATS subscription (queue
// groups too) through a consumer.Consumer, one at a time in arrival order.
//
// Core NATS never redelivers: there is no acknowledgement, a message that
// reaches no subscriber or that a subscriber fails to apply is gone. The
// wrapper therefore protects against duplicates from publishers only (a
// producer that retries, a relay [CoreSink] re-publishing after a crash):
// the second copy with the same id is a Duplicate. A Retry outcome (the
// database unreachable, a failure in Redeliver mode) cannot be handed back
// to the server: the message is held and processed again after its
// RetryAfter or a capped, jittered backoff, while the messages behind it
// wait in the subscription (up to its pending limits), so no message of a
// key overtakes an earlier one; a database outage is logged once when it
// begins and once when it ends. A message still held when Run stops is
// logged at Error level and lost. Use JetStream where messages must not be
// lost.
//
// A CoreSubscriber is an idemq.Service: Ready is closed once the server
// confirmed the subscription, so a message published after that reaches
// it. One Run at a time; Run may be called again after it returned.
type CoreSubscriber struct {
	c       *consumer.Consumer
	nc      *nats.Conn
	subject string
	cfg     CoreSubscriberConfig
	log     *slog.Logger
	state   lifecycle.State
}

// NewCoreSubscriber returns a subscriber applying the messages published
// to subject (wildcards allowed) on nc through c.
func NewCoreSubscriber(c *consumer.Consumer, nc *nats.Conn, subject string, cfg CoreSubscriberConfig) (*CoreSubscriber, error) {
	const component = "nats.CoreSubscriber"
	if c == nil {
		return nil, idemq.NewConfigError(component, "consumer", "is nil")
	}
	if err := checkConn(component, "nc", nc); err != nil {
		return nil, err
	}
	if err := checkSubject(component, "subject", subject, true); err != nil {
		return nil, err
	}
	switch {
	case strings.ContainsAny(cfg.Queue, " \t\r\n"):
		return nil, idemq.NewConfigError(component, "Queue", "%q holds a blank", cfg.Queue)
	case cfg.ShutdownGrace < 0:
		return nil, idemq.NewConfigError(component, "ShutdownGrace", "%v is negative", cfg.ShutdownGrace)
	}
	if err := checkHeaderName(component, "IDHeader", cfg.IDHeader); err != nil {
		return nil, err
	}
	cfg.IDHeader = cmp.Or(cfg.IDHeader, IDHeaderDefault)
	cfg.ShutdownGrace = cmp.Or(cfg.ShutdownGrace, ShutdownGraceDefault)
	cfg.Retry = cfg.Retry.WithDefaults(RetryDefault)
	if err := cfg.Retry.Validate(component); err != nil {
		return nil, err
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	log := cfg.Logger.With(slog.String("subject", subject), slog.String("scope", c.Scope()))
	if cfg.Queue != "" {
		log = log.With(slog.String("queue", cfg.Queue))
	}
	return &CoreSubscriber{c: c, nc: nc, subject: subject, cfg: cfg, log: log}, nil
}

// Ready is closed once Run's subscription is confirmed by the server.
func (s *CoreSubscriber) Ready() <-chan struct{} { return s.state.Ready() }

// Run subscribes and applies messages until ctx is cancelled, then drains
// the subscription (the server stops sending, what it sent is applied,
// within ShutdownGrace) and returns nil. It returns an error if the
// subscription fails, the connection is closed, a Test.BeforeAck hook
// vetoed, or ([idemq.ErrRunning]) another Run is active.
func (s *CoreSubscriber) Run(ctx context.Context) error {
	ready, end, err := s.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	var sub *nats.Subscription
	if s.cfg.Queue != "" {
		sub, err = s.nc.QueueSubscribeSync(s.subject, s.cfg.Queue)
	} else {
		sub, err = s.nc.SubscribeSync(s.subject)
	}
	if err != nil {
		return fmt.Errorf("idemq/nats: subscribe to %s: %w", s.subject, err)
	}
	if err := flush(ctx, s.nc, ackTimeout); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("idemq/nats: subscribe to %s: %w", s.subject, err)
	}
	ready()

	pctx, cancel := lifecycle.Grace(ctx, s.cfg.ShutdownGrace)
	defer cancel()
	k := inbound.New(inbound.Config{Retry: s.cfg.Retry, Logger: s.log})
	a := &coreApply{s: s, k: k, process: k.Processor(s.c, false)}
	for {
		raw, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return a.drain(pctx, sub)
			}
			_ = sub.Unsubscribe()
			return fmt.Errorf("idemq/nats: subscription to %s: %w", s.subject, err)
		}
		if err := a.apply(ctx, pctx, raw); errors.Is(err, errCrash) {
			_ = sub.Unsubscribe()
			return err
		}
	}
}

// coreApply is one Run's settling of core NATS messages (an
// inbound.Client): there is nothing to acknowledge and no dead-letter
// subject.
type coreApply struct {
	s       *CoreSubscriber
	k       *inbound.Kernel
	process inbound.Process
}

// drain stops the server sending and applies what it had sent.
func (a *coreApply) drain(ctx context.Context, sub *nats.Subscription) error {
	if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("idemq/nats: drain %s: %w", a.s.subject, err)
	}
	for ctx.Err() == nil {
		raw, err := sub.NextMsg(20 * time.Millisecond)
		switch {
		case err == nil:
			if err := a.apply(ctx, ctx, raw); errors.Is(err, errCrash) {
				return err
			}
		case errors.Is(err, nats.ErrTimeout):
			if !sub.IsValid() { // drain finished and nothing left
				return nil
			}
		default: // the subscription is gone: drained
			return nil
		}
	}
	_ = sub.Unsubscribe()
	return nil
}

// apply processes raw under work, holding it (until wait ends) while it
// cannot be applied. It returns an errCrash, or wait's error when the
// message was lost.
func (a *coreApply) apply(wait, work context.Context, raw *nats.Msg) error {
	msg := &consumer.Message{Payload: raw.Data, Headers: flatten(raw.Header), Source: raw}
	if msg.Payload == nil {
		msg.Payload = []byte{}
	}
	if vals := raw.Header.Values(a.s.cfg.IDHeader); len(vals) > 0 {
		msg.ID = vals[0]
	}
	return a.k.Group(wait, work, []*consumer.Message{msg}, a.process, a)
}

// DeadLetter has nowhere to publish: the consumer's DeadLetter hook is
// core NATS's dead-letter destination.
func (a *coreApply) DeadLetter(_ context.Context, _ []*consumer.Message, _ []consumer.Result, dead []int) (int, error) {
	return len(dead), nil
}

// Settle has nothing to acknowledge; it runs the Test.BeforeAck crash
// point.
func (a *coreApply) Settle(ctx context.Context, msgs []*consumer.Message, results []consumer.Result, _ []inbound.Step) error {
	if hook := a.s.cfg.Test.BeforeAck; hook != nil {
		if err := hook(ctx, msgs, results); err != nil {
			return fmt.Errorf("%w: %w", errCrash, err)
		}
	}
	return nil
}

// Release logs the messages lost: core NATS cannot take them back.
func (a *coreApply) Release(msgs []*consumer.Message) {
	for _, m := range msgs {
		a.s.log.Error("idemq/nats: core NATS cannot redeliver; message lost", slog.String("id", m.ID))
	}
}
