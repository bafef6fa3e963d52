package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq/consumer"
)

// CoreConfig configures a [CoreSubscriber]. The zero value is ready to use.
type CoreConfig struct {
	// Queue, if set, joins the queue group of that name: the subscribers
	// of one group share the subject's messages.
	Queue string
	// IDHeader names the header carrying the message id. Defaults to
	// "Nats-Msg-Id". Core NATS has no sequence to fall back on: a message
	// without the header gets the id "" and the consumer dead-letters it
	// with consumer.ErrInvalidMessage, unless the consumer derives its key
	// from the payload (consumer.Config.KeyFunc).
	IDHeader string
	// BeforeAck, if set, is called with each message and its result after
	// processing. A non-nil error stops Run at once (Run returns it wrapped
	// in [ErrCrash]); core NATS has no acknowledgement, so this only
	// simulates a crash for tests.
	BeforeAck func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error
	// ShutdownTimeout bounds the time Run spends, after ctx is cancelled,
	// draining the subscription and applying what it had received. Defaults
	// to 30 seconds.
	ShutdownTimeout time.Duration
	// Logger receives the outcomes that are lost on core NATS (a Retry
	// cannot be redelivered). Defaults to slog.Default().
	Logger *slog.Logger
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
type CoreSubscriber struct {
	c       *consumer.Consumer
	nc      *nats.Conn
	subject string
	cfg     CoreConfig
	log     *slog.Logger
}

// NewCoreSubscriber returns a subscriber applying the messages published
// to subject (wildcards allowed) on nc through c.
func NewCoreSubscriber(c *consumer.Consumer, nc *nats.Conn, subject string, cfg CoreConfig) (*CoreSubscriber, error) {
	switch {
	case c == nil || nc == nil:
		return nil, fmt.Errorf("%w: nil consumer or connection", ErrConfig)
	case subject == "":
		return nil, fmt.Errorf("%w: empty subject", ErrConfig)
	case cfg.ShutdownTimeout < 0:
		return nil, fmt.Errorf("%w: ShutdownTimeout must not be negative", ErrConfig)
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = jetstream.MsgIDHeader
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With(slog.String("subject", subject), slog.String("scope", c.Scope()))
	if cfg.Queue != "" {
		log = log.With(slog.String("queue", cfg.Queue))
	}
	return &CoreSubscriber{c: c, nc: nc, subject: subject, cfg: cfg, log: log}, nil
}

// Subscribe subscribes and returns a function running the processing loop
// (the blocking part of Run). Use it when messages published right after
// subscribing must not be missed: core NATS delivers only to
// subscriptions the server already knows, and Subscribe returns after the
// server confirmed the subscription.
func (s *CoreSubscriber) Subscribe(ctx context.Context) (run func() error, err error) {
	var sub *nats.Subscription
	if s.cfg.Queue != "" {
		sub, err = s.nc.QueueSubscribeSync(s.subject, s.cfg.Queue)
	} else {
		sub, err = s.nc.SubscribeSync(s.subject)
	}
	if err != nil {
		return nil, fmt.Errorf("idemq/nats: subscribe to %s: %w", s.subject, err)
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("idemq/nats: subscribe to %s: %w", s.subject, err)
	}
	return func() error { return s.loop(ctx, sub) }, nil
}

// Run subscribes and applies messages until ctx is cancelled, then drains
// the subscription (the server stops sending, what it sent is applied,
// within ShutdownTimeout) and returns nil. It returns an error if the
// subscription fails, the connection is closed, or a BeforeAck hook vetoed
// (wrapping [ErrCrash]).
func (s *CoreSubscriber) Run(ctx context.Context) error {
	run, err := s.Subscribe(ctx)
	if err != nil {
		return err
	}
	return run()
}

func (s *CoreSubscriber) loop(ctx context.Context, sub *nats.Subscription) error {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		graceAfter(ctx, pctx, s.cfg.ShutdownTimeout, cancel)
	}()

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
	if s.cfg.BeforeAck != nil {
		if err := s.cfg.BeforeAck(ctx, []*consumer.Message{msg}, []consumer.Result{r}); err != nil {
			return fmt.Errorf("%w: %w", ErrCrash, err)
		}
	}
	if r.Outcome == consumer.Retry {
		s.log.Error("idemq/nats: core NATS cannot redeliver; message lost", slog.String("key", r.Key), slog.Any("error", r.Err))
	}
	return nil
}
