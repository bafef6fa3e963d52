package nats

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
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
	// by JetStream within one Publish call. Defaults to 256. Keep it below
	// the JetStream context's async publish limit
	// (jetstream.WithPublishAsyncMaxPending, default 4000). Ignored by
	// [CoreSink].
	MaxInFlight int
	// AckTimeout bounds the wait for one acknowledgement (or, for
	// [CoreSink], for the flush of a batch) when ctx has no earlier
	// deadline; a message not acknowledged in time is reported as a
	// retryable timeout (a duplicate it causes is dropped by the stream's
	// duplicate window). Defaults to 10 seconds.
	AckTimeout time.Duration
}

func (c SinkConfig) withDefaults() (SinkConfig, error) {
	if c.MaxInFlight < 0 || c.AckTimeout < 0 {
		return c, fmt.Errorf("%w: MaxInFlight and AckTimeout must not be negative", ErrConfig)
	}
	if c.Subject == nil {
		c.Subject = func(d string) string { return d }
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = 10 * time.Second
	}
	return c, nil
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
//     once, in batch order on one connection, so the stream stores the
//     messages of a key in relay order.
//
// Per-message failures come back as a *[relay.PublishError]. Errors that a
// retry cannot fix are marked with [idemq.Permanent] so the relay
// dead-letters the row at once: no stream captures the subject (checked
// with the server before the verdict, since a stream that is electing a
// leader answers "no responders" too), a message over the server's or the
// stream's size limit, an invalid subject, a destination mapping to no
// subject. Timeouts, a lost connection, a stream at its limits with
// DiscardNew and a cancelled context are retryable.
//
// Order: once a message of a key failed, the later messages of that key
// in the batch not yet sent are not sent but reported as relay.ErrSkipped.
// A message whose acknowledgement fails after it was sent (a timeout, a
// connection lost with acks in flight) cannot hold back the later messages
// of its key already in flight; if the stream stored it after all, its
// retry is dropped as a duplicate and order holds, but if it was lost, its
// retry lands after them. Set MaxInFlight to 1 where that must never
// happen (at the cost of one round trip per message).
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
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrConfig)
	}
	cfg, err := cfg.withDefaults()
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
func (s *JetStreamSink) Publish(ctx context.Context, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	failed := make(map[int]error)
	blocked := make(map[string]bool) // keys with a message that failed before sending
	type pending struct {
		i   int
		fut jetstream.PubAckFuture
	}
	window := make([]pending, 0, min(len(batch), s.cfg.MaxInFlight))
	noStream := make(map[string]bool) // subject -> no stream captures it (looked up once)

	wait := func(p pending) {
		if err := s.await(ctx, p.fut); err != nil {
			failed[p.i] = s.classify(ctx, p.fut.Msg().Subject, err, noStream)
			if k := batch[p.i].Key; k != "" {
				blocked[k] = true // hold back what of its key is not sent yet
			}
		}
	}
	for i := range batch {
		m := &batch[i]
		if m.Key != "" && blocked[m.Key] {
			failed[i] = relay.ErrSkipped
			continue
		}
		if ctx.Err() != nil {
			failed[i] = ctx.Err()
			continue
		}
		msg, err := natsMsg(m, s.cfg.Subject)
		var fut jetstream.PubAckFuture
		if err == nil {
			if len(window) == cap(window) {
				wait(window[0])
				window = window[1:]
			}
			fut, err = s.js.PublishMsgAsync(msg)
			if err != nil {
				err = s.classify(ctx, msg.Subject, err, noStream)
			}
		}
		if err != nil {
			failed[i] = err
			if m.Key != "" {
				blocked[m.Key] = true
			}
			continue
		}
		window = append(window, pending{i, fut})
	}
	for _, p := range window {
		wait(p)
	}
	return result(ctx, batch, failed)
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
func (s *JetStreamSink) classify(ctx context.Context, subject string, err error, noStream map[string]bool) error {
	switch {
	case err == nil || idemq.IsPermanent(err):
		return err
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum),
		errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrHeadersNotSupported):
		return idemq.Permanent(fmt.Errorf("idemq/nats: publish to %s: %w", subject, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		none, known := noStream[subject]
		if !known && ctx.Err() == nil {
			_, lerr := s.js.StreamNameBySubject(ctx, subject)
			if lerr == nil || errors.Is(lerr, jetstream.ErrStreamNotFound) {
				none = errors.Is(lerr, jetstream.ErrStreamNotFound)
				noStream[subject] = none
			}
		}
		if none {
			return idemq.Permanent(fmt.Errorf("idemq/nats: no stream captures subject %s: %w", subject, err))
		}
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
// Nats-Msg-Id header, so a subscriber wrapped with [NewSubscription]
// drops the copies a relay re-publish creates.
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
	if nc == nil {
		return nil, fmt.Errorf("%w: nil connection", ErrConfig)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &CoreSink{nc: nc, cfg: cfg}, nil
}

// Publish publishes batch and flushes the connection. It returns nil when
// the server received every message, a *[relay.PublishError] otherwise.
func (s *CoreSink) Publish(ctx context.Context, batch []relay.Message) error {
	if len(batch) == 0 {
		return nil
	}
	failed := make(map[int]error)
	blocked := make(map[string]bool)
	var sent []int
	for i := range batch {
		m := &batch[i]
		if m.Key != "" && blocked[m.Key] {
			failed[i] = relay.ErrSkipped
			continue
		}
		msg, err := natsMsg(m, s.cfg.Subject)
		if err == nil {
			err = s.nc.PublishMsg(msg)
		}
		if err != nil {
			if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrHeadersNotSupported) {
				err = idemq.Permanent(fmt.Errorf("idemq/nats: publish to %s: %w", msg.Subject, err))
			}
			failed[i] = err
			if m.Key != "" {
				blocked[m.Key] = true
			}
			continue
		}
		sent = append(sent, i)
	}
	if len(sent) > 0 {
		fctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			fctx, cancel = context.WithTimeout(ctx, s.cfg.AckTimeout)
		}
		err := s.nc.FlushWithContext(fctx)
		cancel()
		if err != nil {
			for _, i := range sent {
				failed[i] = fmt.Errorf("idemq/nats: flush: %w", err)
			}
		}
	}
	return result(ctx, batch, failed)
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

func result(ctx context.Context, batch []relay.Message, failed map[int]error) error {
	if len(failed) == 0 {
		return nil
	}
	if ctx.Err() != nil && len(failed) == len(batch) {
		return ctx.Err()
	}
	return &relay.PublishError{Failed: failed}
}
