package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/relay"
)

// HeaderKey carries the outbox message's ordering key, when it has one.
const HeaderKey = "Idemq-Key"

// ErrNoSubject is the cause (wrapped, permanent) of a message whose
// destination maps to no subject.
var ErrNoSubject = errors.New("idemq/nats: destination maps to no subject")

// SinkConfig configures a [JetStreamSink] or a [CoreSink]. The zero value
// is ready to use.
type SinkConfig struct {
	// Subject maps an outbox destination to a NATS subject. Defaults to the
	// destination itself. Returning "" fails that message permanently
	// ([ErrNoSubject]).
	Subject func(destination string) string
	// MaxInFlight bounds the messages published and not yet acknowledged
	// by JetStream within one Publish call. Keep it below the JetStream
	// context's async publish limit (jetstream.WithPublishAsyncMaxPending,
	// default 4000). Ignored by [CoreSink]. Defaults to
	// [MaxInFlightDefault].
	MaxInFlight int
	// AckTimeout bounds the wait for one acknowledgement (or, for
	// [CoreSink], for the flush of a batch) when ctx has no earlier
	// deadline; a message not acknowledged in time is reported as a
	// retryable timeout (a duplicate it causes is dropped by the stream's
	// duplicate window). At least 1ms. Defaults to [AckTimeoutDefault].
	AckTimeout time.Duration
}

// The defaults of [SinkConfig].
const (
	MaxInFlightDefault = 256
	AckTimeoutDefault  = 10 * time.Second
)

func (c SinkConfig) withDefaults() SinkConfig {
	if c.Subject == nil {
		c.Subject = func(d string) string { return d }
	}
	c.MaxInFlight = cmp.Or(c.MaxInFlight, MaxInFlightDefault)
	c.AckTimeout = cmp.Or(c.AckTimeout, AckTimeoutDefault)
	return c
}

func (c SinkConfig) validate(component string) error {
	switch {
	case c.MaxInFlight < 0:
		return idemq.NewConfigError(component, "MaxInFlight", "%d is negative", c.MaxInFlight)
	}
	return checkDuration(component, "AckTimeout", c.AckTimeout)
}

// newSinkConfig fills cfg's defaults and validates it.
func newSinkConfig(component string, cfg SinkConfig) (SinkConfig, error) {
	cfg = cfg.withDefaults()
	return cfg, cfg.validate(component)
}

// JetStreamSink is a [relay.Sink] publishing outbox messages to JetStream:
//
//   - destination -> subject (through [SinkConfig.Subject]), which a stream
//     must capture;
//   - outbox id -> the Nats-Msg-Id header, so the stream's duplicate window
//     (jetstream.StreamConfig.Duplicates, 2 minutes by default) drops the
//     copy a relay re-publishes after a crash between publish and delete,
//     before any consumer sees it; other outbox headers are copied, the
//     outbox key goes into [HeaderKey];
//   - the batch is published asynchronously, at most
//     [SinkConfig.MaxInFlight] messages awaiting their acknowledgement at
//     once, and at most one per key.
//
// Per-message failures come back as a *[relay.PublishError]. Errors that a
// retry cannot fix are marked with [idemq.Permanent] so the relay
// dead-letters the row at once: a message over the server's or the
// stream's size limit, an invalid subject, a destination mapping to no
// subject. Timeouts, a lost connection, a stream at its limits with
// DiscardNew, a cancelled context and a subject no stream captures (a
// stream not created yet, deleted, or electing a leader: an outage of that
// destination, which ends when the stream is there) are retryable.
//
// Order: a message is published only once the previous message of its
// key in the batch was acknowledged, so the stream stores a key's messages
// in relay order even when an acknowledgement fails; once a message of a
// key failed, the later messages of that key are not sent but reported as
// relay.ErrSkipped. Messages of different keys are pipelined, up to
// MaxInFlight at once.
//
// A JetStreamSink is safe for concurrent use; it does not close the
// connection.
type JetStreamSink struct {
	js  jetstream.JetStream
	cfg SinkConfig
}

// NewJetStreamSink returns a Sink publishing through js. Create js with
// jetstream.WithPublishAsyncTimeout if other code shares it, so that no
// async publish can wait for its acknowledgement forever.
func NewJetStreamSink(js jetstream.JetStream, cfg SinkConfig) (*JetStreamSink, error) {
	if nilcheck.IsNil(js) {
		return nil, idemq.NewConfigError("nats.JetStreamSink", "js", "is nil")
	}
	cfg, err := newSinkConfig("nats.JetStreamSink", cfg)
	if err != nil {
		return nil, err
	}
	return &JetStreamSink{js: js, cfg: cfg}, nil
}

var (
	_ relay.Sink = (*JetStreamSink)(nil)
	_ relay.Sink = (*CoreSink)(nil)
)

// Publish publishes batch and waits for every acknowledgement. It returns
// nil when the stream stored (or, as a duplicate, had already stored)
// every message, a *[relay.PublishError] naming the failed indexes
// otherwise, and ctx's error if ctx ended before anything was
// acknowledged.
func (s *JetStreamSink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	f := relay.NewFailures(batch)
	type pending struct {
		i    int
		fut  jetstream.PubAckFuture
		done bool
	}
	var window []*pending             // in flight, in publish order
	last := make(map[string]*pending) // key -> its latest message in flight
	settle := func(p *pending) {
		if p.done {
			return
		}
		p.done = true
		if err := s.await(ctx, p.fut); err != nil {
			f.Fail(p.i, s.classify(p.fut.Msg().Subject, err))
		}
	}
	for i := range batch {
		if p := last[batch[i].Key]; p != nil {
			// The key's previous message must be stored (or failed, so
			// that this one is skipped) before this one is sent.
			settle(p)
		}
		if f.Skip(i) {
			continue
		}
		if ctx.Err() != nil {
			f.Fail(i, ctx.Err())
			continue
		}
		msg, err := natsMsg(&batch[i], s.cfg.Subject)
		var fut jetstream.PubAckFuture
		if err == nil {
			for len(window) > 0 && (window[0].done || len(window) >= s.cfg.MaxInFlight) {
				settle(window[0])
				window = window[1:]
			}
			fut, err = s.js.PublishMsgAsync(msg)
			if err != nil {
				err = s.classify(msg.Subject, err)
			}
		}
		if err != nil {
			f.Fail(i, err)
			continue
		}
		p := &pending{i: i, fut: fut}
		window = append(window, p)
		if k := batch[i].Key; k != "" {
			last[k] = p
		}
	}
	for _, p := range window {
		settle(p)
	}
	return f.Err(ctx)
}

// await waits for fut's acknowledgement, for ctx, or for AckTimeout.
func (s *JetStreamSink) await(ctx context.Context, fut jetstream.PubAckFuture) error {
	// Fast path: already acknowledged.
	select {
	case <-fut.Ok():
		return nil
	case err := <-fut.Err():
		return err
	default:
	}
	timer := time.NewTimer(s.cfg.AckTimeout)
	defer timer.Stop()
	select {
	case <-fut.Ok():
		return nil
	case err := <-fut.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return fmt.Errorf("idemq/nats: no acknowledgement after %v: %w", s.cfg.AckTimeout, jetstream.ErrAsyncPublishTimeout)
	}
}

// classify marks err permanent when no retry can help.
func (s *JetStreamSink) classify(subject string, err error) error {
	switch {
	case err == nil || idemq.IsPermanent(err):
		return err
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum),
		errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrHeadersNotSupported):
		return idemq.Permanent(fmt.Errorf("idemq/nats: publish to %s: %w", subject, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// Retryable: the stream may be created (or finish electing its
		// leader) any time, and the message must not be lost meanwhile.
		return fmt.Errorf("idemq/nats: no stream answered for subject %s (create a stream that captures it; retried until then): %w", subject, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 400 && apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		// Bad request: the server rejects this message as it is.
		return idemq.Permanent(fmt.Errorf("idemq/nats: publish to %s: %w", subject, err))
	}
	return err
}

// CoreSink is a [relay.Sink] publishing outbox messages on core NATS, for
// subjects no stream captures. Core NATS has no acknowledgements: Publish
// returns once the server has received every message (a flush), which
// says nothing about subscribers; a subscriber that is not connected at
// that moment never gets the message. The outbox id still travels in the
// Nats-Msg-Id header, so a [CoreSubscriber] drops the copies a relay
// re-publish creates.
//
// Errors that a retry cannot fix are permanent: a message over the
// server's payload limit, an invalid subject, a destination mapping to no
// subject. A closed or disconnected connection and a failed flush are
// retryable (every message of the batch then counts as failed: core NATS
// cannot say which arrived, and re-publishing them is safe).
//
// A CoreSink is safe for concurrent use; it does not close the connection.
type CoreSink struct {
	nc  *nats.Conn
	cfg SinkConfig
}

// NewCoreSink returns a Sink publishing on nc.
func NewCoreSink(nc *nats.Conn, cfg SinkConfig) (*CoreSink, error) {
	if err := checkConn("nats.CoreSink", "nc", nc); err != nil {
		return nil, err
	}
	cfg, err := newSinkConfig("nats.CoreSink", cfg)
	if err != nil {
		return nil, err
	}
	return &CoreSink{nc: nc, cfg: cfg}, nil
}

// Publish publishes batch and flushes the connection. It returns nil when
// the server received every message, a *[relay.PublishError] otherwise.
func (s *CoreSink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	f := relay.NewFailures(batch)
	var sent []int
	for i := range batch {
		if f.Skip(i) {
			continue
		}
		if ctx.Err() != nil {
			f.Fail(i, ctx.Err())
			continue
		}
		msg, err := natsMsg(&batch[i], s.cfg.Subject)
		if err == nil {
			err = s.nc.PublishMsg(msg)
		}
		if err != nil {
			if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrHeadersNotSupported) {
				err = idemq.Permanent(fmt.Errorf("idemq/nats: publish to %s: %w", msg.Subject, err))
			}
			f.Fail(i, err)
			continue
		}
		sent = append(sent, i)
	}
	if len(sent) > 0 {
		if err := flush(ctx, s.nc, s.cfg.AckTimeout); err != nil {
			for _, i := range sent {
				f.Fail(i, fmt.Errorf("idemq/nats: flush: %w", err))
			}
		}
	}
	return f.Err(ctx)
}

// flush waits for the server to have received everything published on nc,
// for ctx or, when ctx has no deadline, for timeout.
func flush(ctx context.Context, nc *nats.Conn, timeout time.Duration) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return nc.FlushWithContext(ctx)
}

// natsMsg builds the NATS message for an outbox message.
func natsMsg(m *relay.Message, subject func(string) string) (*nats.Msg, error) {
	subj := subject(m.Destination)
	if subj == "" {
		return nil, idemq.Permanent(fmt.Errorf("%w: message %s, destination %q", ErrNoSubject, m.ID, m.Destination))
	}
	msg := nats.NewMsg(subj)
	msg.Data = m.Payload
	for k, v := range m.Headers {
		msg.Header.Set(k, v)
	}
	if m.Key != "" {
		msg.Header.Set(HeaderKey, m.Key)
	}
	msg.Header.Set(jetstream.MsgIDHeader, m.ID.String())
	return msg, nil
}
