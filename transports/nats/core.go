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
	// Logger receives the outcomes that are lost on core NATS (a Retry
	// cannot be redelivered). Defaults to slog.Default().
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
// database unreachable, retries exhausted in Redeliver mode) cannot be
// handed back to the server; it is logged at Error level and the message is
// lost, so leave consumer.Config.Redeliver false with core NATS. Use
// JetStream where messages must not be lost.
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
	for {
		raw, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return s.drain(pctx, sub)
			}
			_ = sub.Unsubscribe()
			return fmt.Errorf("idemq/nats: subscription to %s: %w", s.subject, err)
		}
		if err := s.apply(pctx, raw); err != nil {
			_ = sub.Unsubscribe()
			return err
		}
	}
}

// drain stops the server sending and applies what it had sent.
func (s *CoreSubscriber) drain(ctx context.Context, sub *nats.Subscription) error {
	if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("idemq/nats: drain %s: %w", s.subject, err)
	}
	for ctx.Err() == nil {
		raw, err := sub.NextMsg(20 * time.Millisecond)
		switch {
		case err == nil:
			if err := s.apply(ctx, raw); err != nil {
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

func (s *CoreSubscriber) apply(ctx context.Context, raw *nats.Msg) error {
	msg := &consumer.Message{Payload: raw.Data, Headers: flatten(raw.Header), Source: raw}
	if msg.Payload == nil {
		msg.Payload = []byte{}
	}
	if vals := raw.Header.Values(s.cfg.IDHeader); len(vals) > 0 {
		msg.ID = vals[0]
	}
	r := s.c.Process(ctx, msg)
	if hook := s.cfg.Test.BeforeAck; hook != nil {
		if err := hook(ctx, []*consumer.Message{msg}, []consumer.Result{r}); err != nil {
			return fmt.Errorf("%w: %w", errCrash, err)
		}
	}
	if r.Outcome == consumer.Retry {
		s.log.Error("idemq/nats: core NATS cannot redeliver; message lost", slog.String("key", r.Key), slog.Any("error", r.Err))
	}
	return nil
}
