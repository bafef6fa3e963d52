package webhook

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
)

// Defaults of [ReceiverConfig].
const (
	ToleranceDefault = 5 * time.Minute
	ScopeDefault     = "webhook"
	MaxBodyDefault   = 1 << 20
	LeaseTTLDefault  = time.Minute
)

// ReceiverConfig configures a [Receiver].
type ReceiverConfig struct {
	// Keys verify the signatures: "whsec_" secrets (v1) and "whpk_" public
	// keys (v1a; a "whsk_" key works too). A message verifies when any
	// entry of its signature matches any key, so during a sender's key
	// rotation list both the old and the new key. Required.
	Keys []string
	// Tolerance is how far the webhook-timestamp may lie from now, in
	// either direction. Defaults to 5 minutes.
	Tolerance time.Duration
	// Scope is the inbox scope the webhook-ids are recorded under: two
	// receivers of one sender with different scopes each apply a message
	// once. Defaults to "webhook".
	Scope string
	// MaxBody is the largest body accepted, in bytes; a larger one gets
	// 413. Defaults to 1 MiB.
	MaxBody int64
	// LeaseTTL is how long [Receiver.Leased] holds a webhook-id while its
	// handler runs; another delivery of the id waits that long before it
	// takes over. Defaults to 1 minute.
	LeaseTTL time.Duration
	// Logger receives handler and database errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c ReceiverConfig) withDefaults() ReceiverConfig {
	c.Tolerance = cmp.Or(c.Tolerance, ToleranceDefault)
	c.Scope = cmp.Or(c.Scope, ScopeDefault)
	c.MaxBody = cmp.Or(c.MaxBody, MaxBodyDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, LeaseTTLDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ReceiverConfig) validate() error {
	const component = "webhook.Receiver"
	switch {
	case len(c.Keys) == 0:
		return idemq.NewConfigError(component, "Keys", "is empty: a receiver needs the keys to verify with")
	case c.Tolerance < 0:
		return idemq.NewConfigError(component, "Tolerance", "%v is negative", c.Tolerance)
	case c.MaxBody < 0:
		return idemq.NewConfigError(component, "MaxBody", "%d is negative", c.MaxBody)
	case c.LeaseTTL < 0:
		return idemq.NewConfigError(component, "LeaseTTL", "%v is negative", c.LeaseTTL)
	}
	if _, err := ParseKeys(c.Keys...); err != nil {
		return idemq.NewConfigError(component, "Keys", "%v", err)
	}
	return nil
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

// Handler applies one webhook inside tx, the transaction that records its
// webhook-id in the inbox: both commit or neither does. A returned error
// rolls tx back and answers 500, so the sender retries; an error marked
// with idemq.Permanent answers 422, which a Standard Webhooks sender does
// not retry.
type Handler func(ctx context.Context, tx pgx.Tx, d Delivery) error

// Receiver verifies Standard Webhooks signatures and applies each
// webhook-id once through an inbox.
type Receiver struct {
	store *inbox.Store
	cfg   ReceiverConfig
	keys  []Key
	owner string // this receiver's name on the leases it takes
	log   *slog.Logger
}

// NewReceiver validates cfg and returns a receiver recording into store.
func NewReceiver(store *inbox.Store, cfg ReceiverConfig) (*Receiver, error) {
	if store == nil {
		return nil, idemq.NewConfigError("webhook.Receiver", "store", "is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	keys, _ := ParseKeys(cfg.Keys...) // validated above
	owner, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	return &Receiver{store: store, cfg: cfg, keys: keys, owner: owner.String(), log: cfg.Logger.With("component", "idemq.webhook.receiver")}, nil
}

// Handler returns the http.Handler that serves h:
//
//   - a missing, stale, future or wrong signature: 401, nothing recorded;
//   - a webhook-id seen before with the same body: 200 without running h;
//   - the same webhook-id with another body: 409, not applied;
//   - otherwise h runs in the transaction that records the id: 200 after
//     the commit, 500 (with Retry-After for idemq.RetryAfter) or 422
//     (idemq.Permanent) after a rollback.
func (r *Receiver) Handler(h Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		d, sum, ok := r.verify(w, req)
		if !ok {
			return
		}
		ctx := req.Context()
		tx, claim, err := r.store.BeginClaim(ctx, r.cfg.Scope, d.ID, sum)
		if r.refused(w, d.ID, err) {
			if tx != nil {
				_ = tx.Rollback(ctx)
			}
			return
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
		if !claim.New {
			w.WriteHeader(http.StatusOK) // a duplicate: applied before
			return
		}
		err = h(ctx, tx, d)
		if err == nil {
			err = tx.Commit(ctx)
		}
		r.answer(w, d.ID, err)
	})
}

// LeasedHandler applies one webhook whose effects lie outside Postgres (an
// email, a call to another service) under lease, the inbox's hold on the
// webhook-id: pass lease.Token downstream so the far side can refuse a
// holder whose lease was taken over. Errors mean what they mean for
// [Handler].
type LeasedHandler func(ctx context.Context, lease inbox.Lease, d Delivery) error

// Leased returns the http.Handler that serves h in the inbox's leased mode:
// verified as by [Receiver.Handler], the webhook-id is acquired for
// [ReceiverConfig.LeaseTTL] and marked succeeded or failed after h. A
// webhook-id another request holds under a live lease gets 503 with
// Retry-After, so the sender retries after the lease; one that became a
// dead letter gets 422.
func (r *Receiver) Leased(h LeasedHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		d, sum, ok := r.verify(w, req)
		if !ok {
			return
		}
		ctx := req.Context()
		got, err := r.store.Acquire(ctx, r.cfg.Scope, d.ID, sum, r.owner, r.cfg.LeaseTTL)
		if r.refused(w, d.ID, err) {
			return
		}
		if !got.New {
			switch rec := got.Existing; rec.Status {
			case inbox.Succeeded:
				w.WriteHeader(http.StatusOK)
			case inbox.FailedFinal:
				http.Error(w, "the webhook cannot be applied", http.StatusUnprocessableEntity)
			default: // in progress under another live lease
				w.Header().Set("Retry-After", seconds(time.Until(rec.LeaseUntil)))
				http.Error(w, "the webhook is being applied", http.StatusServiceUnavailable)
			}
			return
		}
		err = h(ctx, got.Lease, d)
		// Record the outcome even if the client went away meanwhile.
		fctx := context.WithoutCancel(ctx)
		switch {
		case err == nil:
			err = r.store.Complete(fctx, got.Lease, nil)
		case idemq.IsPermanent(err):
			err = errors.Join(err, r.store.FailFinal(fctx, got.Lease, err))
		default:
			err = errors.Join(err, r.store.Fail(fctx, got.Lease, err))
		}
		r.answer(w, d.ID, err)
	})
}

// verify reads and verifies the request; on failure it has answered.
func (r *Receiver) verify(w http.ResponseWriter, req *http.Request) (Delivery, []byte, bool) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return Delivery{}, nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, "reading the body failed", http.StatusBadRequest)
		}
		return Delivery{}, nil, false
	}
	id, ts := req.Header.Get(HeaderID), req.Header.Get(HeaderTimestamp)
	if err := Verify(r.keys, id, ts, req.Header.Get(HeaderSignature), body, r.cfg.Tolerance, time.Now()); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return Delivery{}, nil, false
	}
	secs, _ := strconv.ParseInt(ts, 10, 64) // verified above
	sum := sha256.Sum256(body)
	return Delivery{ID: id, Timestamp: time.Unix(secs, 0), Body: body, Request: req}, sum[:], true
}

// refused answers a failed claim of id and reports whether it did.
func (r *Receiver) refused(w http.ResponseWriter, id string, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, inbox.ErrInvalidKey):
		http.Error(w, err.Error(), http.StatusBadRequest)
	default:
		if _, ok := errors.AsType[*inbox.ConflictError](err); ok {
			http.Error(w, "webhook-id already applied with another body", http.StatusConflict)
			return true
		}
		r.log.Error("webhook: recording the id failed", "id", id, "err", err)
		http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
	}
	return true
}

// answer reports the outcome of applying id.
func (r *Receiver) answer(w http.ResponseWriter, id string, err error) {
	switch {
	case err == nil:
		w.WriteHeader(http.StatusOK)
	case idemq.IsPermanent(err):
		http.Error(w, "the webhook cannot be applied", http.StatusUnprocessableEntity)
	default:
		r.log.Error("webhook: applying failed", "id", id, "err", err)
		if d, ok := idemq.RetryAfterHint(err); ok {
			w.Header().Set("Retry-After", seconds(d))
		}
		http.Error(w, "applying the webhook failed", http.StatusInternalServerError)
	}
}

// seconds formats d as a Retry-After value, rounded up, at least 1.
func seconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}
