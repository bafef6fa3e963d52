package webhook

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/transports/internal/inbound"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// Defaults of [ReceiverConfig].
const (
	ToleranceDefault = 5 * time.Minute
	MaxBodyDefault   = 1 << 20
)

// ReceiverRetryDefault is the default [ReceiverConfig.Retry]: Retry-After
// from 1 s up to 1 minute.
var ReceiverRetryDefault = idemq.Retry{BaseDelay: time.Second, MaxDelay: time.Minute}

// HeaderDelivery is the response header by which a receiver steers the
// sender (Svix's delivery control, proposed for Standard Webhooks): the
// value [AbortMessage] asks it not to retry the message.
const HeaderDelivery = "webhook-delivery"

// AbortMessage is the [HeaderDelivery] value that stops the retries of the
// message just sent. The Receiver sets it on every final refusal, since
// Svix retries any status but a 2xx unless told so.
const AbortMessage = "abort-message"

// ReceiverConfig configures a [Receiver]. The inbox scope, retries, lease
// and hooks are the consumer's (consumer.Config).
type ReceiverConfig struct {
	// Keys verify the signatures: "whsec_" secrets (v1) and "whpk_" public
	// keys (v1a; a "whsk_" key works too). A message verifies when any
	// entry of its signature matches any key, so during a sender's key
	// rotation list both the old and the new key. Required.
	Keys []string
	// Tolerance is how far the webhook-timestamp may lie from now, in
	// either direction; at least 1 second, the timestamp's unit. Defaults
	// to 5 minutes.
	Tolerance time.Duration
	// MaxBody is the largest body accepted, in bytes; a larger one gets
	// 413. Defaults to 1 MiB.
	MaxBody int64
	// Retry shapes the Retry-After of a webhook the database could not
	// take (consumer.Result.Unavailable): its BaseDelay and MaxDelay, full
	// jitter, growing while the outage lasts. Defaults to
	// [ReceiverRetryDefault].
	Retry idemq.Retry
	// Logger receives the database's outages: one line when one begins,
	// one when it ends with the count of the webhooks that were refused
	// meanwhile. Defaults to slog.Default().
	Logger *slog.Logger

	// Test holds crash points for tests; leave it zero in production.
	Test ReceiverTestConfig
}

// ReceiverTestConfig holds a [Receiver]'s crash point, for tests and
// chaos drills.
type ReceiverTestConfig struct {
	// BeforeAnswer, if set, runs after the consumer settled a webhook and
	// before the Receiver answers, with the message and its result. A
	// non-nil error aborts the response (http.ErrAbortHandler): the sender
	// sees the connection drop as if the process died between the
	// database commit and the answer, and sends the webhook again.
	BeforeAnswer func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) error
}

func (c ReceiverConfig) withDefaults() ReceiverConfig {
	c.Tolerance = cmp.Or(c.Tolerance, ToleranceDefault)
	c.MaxBody = cmp.Or(c.MaxBody, MaxBodyDefault)
	c.Retry = c.Retry.WithDefaults(ReceiverRetryDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

func (c ReceiverConfig) validate() error {
	const component = "webhook.Receiver"
	switch {
	case len(c.Keys) == 0:
		return idemq.NewConfigError(component, "Keys", "is empty: a receiver needs the keys to verify with")
	case c.Tolerance < 0:
		return idemq.NewConfigError(component, "Tolerance", "%v is negative", c.Tolerance)
	case c.Tolerance > 0 && c.Tolerance < time.Second:
		return idemq.NewConfigError(component, "Tolerance", "%v is below the timestamp's unit of 1s", c.Tolerance)
	case c.MaxBody < 0:
		return idemq.NewConfigError(component, "MaxBody", "%d is negative", c.MaxBody)
	}
	if _, err := signing.ParseKeys(c.Keys...); err != nil {
		return idemq.NewConfigError(component, "Keys", "%v", err)
	}
	return c.Retry.Validate(component)
}

// Delivery is a verified webhook as the handler sees it.
type Delivery struct {
	// ID is the webhook-id: the same on every retry of one message.
	ID string
	// Timestamp is the webhook-timestamp of this attempt.
	Timestamp time.Time
	// Body is the verified request body.
	Body []byte
	// Request is the request, its body already read.
	Request *http.Request
}

// DeliveryOf returns the webhook a consumer's message came from, for
// handlers of a consumer that a [Receiver] feeds.
func DeliveryOf(msg *consumer.Message) (Delivery, bool) {
	if msg == nil {
		return Delivery{}, false
	}
	d, ok := msg.Source.(Delivery)
	return d, ok
}

// errNotAWebhook fails a handler given a message that no Receiver made.
var errNotAWebhook = idemq.Permanent(errors.New("webhook: the message did not come through a webhook.Receiver"))

// Handler applies one webhook inside tx, the transaction that records its
// webhook-id in the inbox: both commit or neither does. It must not
// commit or roll back tx. A returned error rolls tx back and counts as a
// failed attempt; one marked with idemq.Permanent dead-letters the
// webhook at once.
type Handler func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Handle adapts h to the consumer.Handler of the consumer a [Receiver]
// runs on: consumer.New(pool, scope, webhook.Handle(h), cfg).
func Handle(h Handler) consumer.Handler {
	return func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		d, ok := DeliveryOf(msg)
		if !ok {
			return errNotAWebhook
		}
		return h(ctx, tx, d)
	}
}

// LeasedHandler applies one webhook whose effects lie outside Postgres (an
// email, a call to another service) under lease, the inbox's hold on the
// webhook-id, which the consumer renews while h runs: pass lease.Token
// downstream so the far side can refuse a holder whose lease was taken
// over. ctx is cancelled if the lease is lost. Errors mean what they mean
// for [Handler].
type LeasedHandler func(ctx context.Context, d Delivery, lease idemq.Lease) error

// HandleLeased adapts h to the consumer.LeasedHandler of a leased consumer
// a [Receiver] runs on: consumer.NewLeased(pool, scope,
// webhook.HandleLeased(h), cfg).
func HandleLeased(h LeasedHandler) consumer.LeasedHandler {
	return func(ctx context.Context, msg *consumer.Message, lease idemq.Lease) error {
		d, ok := DeliveryOf(msg)
		if !ok {
			return errNotAWebhook
		}
		return h(ctx, d, lease)
	}
}

// Receiver is the http.Handler that verifies Standard Webhooks signatures
// and applies each webhook-id once through a consumer.Consumer: the
// webhook is the consumer's Message (ID = webhook-id, Payload = body,
// Headers = the request's headers, the first value of each, Source = its
// [Delivery]), so it gets everything the consumer gives the
// Kafka and NATS transports: failures counted toward Retry.MaxAttempts
// across deliveries, database errors never counted, a panicking handler
// turned into a failure, the lease renewed while a leased handler runs,
// the dead-letter hook and the OnResult metrics.
//
// The consumer's Result becomes the status the way Kafka turns it into an
// offset commit:
//
//   - a missing, stale, future or wrong signature: 401, nothing recorded;
//   - Applied or Duplicate: 200;
//   - Conflict (the webhook-id seen before with another body): 409;
//   - DeadLettered: 422, or 400 for a webhook-id the inbox cannot take;
//   - Retry: 503 with Retry-After: the consumer's RetryAfter, or while the
//     database is down (consumer.Result.Unavailable) a backoff that grows
//     with the outage ([ReceiverConfig.Retry]); the outage is logged once
//     when it begins and once when it ends, not once per webhook. A
//     sender that keeps a key's order (idemq's relay) holds the key's
//     later webhooks until this one is taken.
//
// 409, 422 and 400 carry "webhook-delivery: abort-message", so neither a
// sender that stops at a 4xx (idemq's Sink) nor one that retries every
// non-2xx (Svix) sends the message again. No 410: it would disable the
// whole endpoint at the sender.
//
// Give the consumer Config.Redeliver: a failed attempt then answers 503 at
// once, its Retry-After from the consumer's backoff, and the sender's
// schedule spaces the attempts. Without it the consumer retries in place
// within the request, up to Retry.MaxElapsed, which must then stay well
// under the sender's timeout (15 s for Svix and idemq's Sink).
type Receiver struct {
	c      *consumer.Consumer
	cfg    ReceiverConfig
	keys   []signing.Key
	kernel *inbound.Kernel
}

// NewReceiver validates cfg and returns a receiver applying webhooks
// through c, a consumer built with [Handle] (or consumer.NewLeased with
// [HandleLeased]) and migrated.
func NewReceiver(c *consumer.Consumer, cfg ReceiverConfig) (*Receiver, error) {
	if c == nil {
		return nil, idemq.NewConfigError("webhook.Receiver", "consumer", "is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	keys, _ := signing.ParseKeys(cfg.Keys...) // validated above
	log := cfg.Logger.With(slog.String("scope", c.Scope()))
	return &Receiver{c: c, cfg: cfg, keys: keys, kernel: inbound.New(inbound.Config{Retry: cfg.Retry, Logger: log})}, nil
}

// ServeHTTP verifies the request and applies it through the consumer; see
// [Receiver] for the statuses.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	d, ok := r.verify(w, req)
	if !ok {
		return
	}
	headers := make(map[string]string, len(req.Header))
	for name, v := range req.Header {
		headers[name] = v[0]
	}
	msgs := []*consumer.Message{{ID: d.ID, Payload: d.Body, Headers: headers, Source: d}}
	started := time.Now()
	results := []consumer.Result{r.c.Process(req.Context(), msgs[0])}
	if hook := r.cfg.Test.BeforeAnswer; hook != nil {
		if err := hook(req.Context(), msgs, results); err != nil {
			panic(http.ErrAbortHandler)
		}
	}
	answer(w, results[0], r.kernel.Plan(started, msgs, results).Delay)
}

// verify reads and verifies the request; on failure it has answered.
func (r *Receiver) verify(w http.ResponseWriter, req *http.Request) (Delivery, bool) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return Delivery{}, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, "reading the body failed", http.StatusBadRequest)
		}
		return Delivery{}, false
	}
	id, ts := req.Header.Get(signing.HeaderID), req.Header.Get(signing.HeaderTimestamp)
	if err := signing.Verify(r.keys, id, ts, req.Header.Get(signing.HeaderSignature), body, r.cfg.Tolerance, time.Now()); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return Delivery{}, false
	}
	secs, _ := strconv.ParseInt(ts, 10, 64) // verified above
	return Delivery{ID: id, Timestamp: time.Unix(secs, 0), Body: body, Request: req}, true
}

// answer maps the consumer's result to the response; the consumer has
// logged it already. retry is the kernel's wait for a Retry.
func answer(w http.ResponseWriter, res consumer.Result, retry time.Duration) {
	switch res.Outcome {
	case consumer.Applied, consumer.Duplicate:
		w.WriteHeader(http.StatusOK)
	case consumer.Conflict:
		w.Header().Set(HeaderDelivery, AbortMessage)
		http.Error(w, "webhook-id already applied with another body", http.StatusConflict)
	case consumer.DeadLettered:
		w.Header().Set(HeaderDelivery, AbortMessage)
		if errors.Is(res.Err, consumer.ErrInvalidMessage) {
			http.Error(w, res.Err.Error(), http.StatusBadRequest)
			return
		}
		http.Error(w, "the webhook cannot be applied", http.StatusUnprocessableEntity)
	default: // Retry: nothing committed
		w.Header().Set("Retry-After", seconds(retry))
		http.Error(w, "the webhook was not applied; retry later", http.StatusServiceUnavailable)
	}
}

// seconds formats d as a Retry-After value, rounded up, at least 1.
func seconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}
