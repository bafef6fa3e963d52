package request

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/internal/nilcheck"
)

// Config configures a [Guard]. The zero value is valid.
type Config struct {
	// Lease is how long an attempt holds its key without renewal. The
	// Guard renews it every Lease/3 while the attempt runs and its context
	// lives, so a crashed process frees its keys within Lease and a live
	// one keeps them however long its handler runs. Keep it short: every
	// retry of a crashed holder's key gets 409 / ABORTED until it ends.
	// Defaults to 5 seconds; the record itself is kept for the store's
	// record TTL (24 hours).
	Lease time.Duration
	// Wait is how long Begin waits for an attempt in flight on the same
	// key to finish before it reports an [*InFlightError]; while waiting
	// it polls the store. Defaults to 0: report at once.
	Wait time.Duration
	// Retry spaces the polls while waiting (BaseDelay and MaxDelay; the
	// bound is Wait). Defaults to [RetryDefault].
	Retry idemq.Retry
	// StoreTimeout bounds every store call, so that a hanging store fails
	// closed in bounded time. Finishing an attempt (Complete, Release)
	// gets its own StoreTimeout even when the request's context is done.
	// Defaults to 5 seconds.
	StoreTimeout time.Duration
	// Keys are the format limits of keys. Defaults to 255 bytes of
	// printable ASCII.
	Keys KeyRules
}

// Defaults of Config.
const (
	LeaseDefault        = 5 * time.Second
	StoreTimeoutDefault = 5 * time.Second
)

// RetryDefault spaces the polls of a waiting Begin.
var RetryDefault = idemq.Retry{BaseDelay: 10 * time.Millisecond, MaxDelay: 250 * time.Millisecond}

func (c Config) withDefaults() Config {
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, StoreTimeoutDefault)
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	c.Keys = c.Keys.WithDefaults()
	return c
}

const component = "request.Guard"

func (c Config) validate() error {
	switch {
	case c.Lease < 3*time.Millisecond:
		return idemq.NewConfigError(component, "Lease", "%v is below 3ms", c.Lease)
	case c.Wait < 0:
		return idemq.NewConfigError(component, "Wait", "%v is negative", c.Wait)
	case c.StoreTimeout < 0:
		return idemq.NewConfigError(component, "StoreTimeout", "%v is negative", c.StoreTimeout)
	}
	if err := c.Retry.Validate(component); err != nil {
		return err
	}
	return c.Keys.Validate(component)
}

// Guard runs requests at most once per key on a [Store]: the seam both
// front ends (HTTP middleware, gRPC interceptor) share. It is safe for
// concurrent use.
type Guard struct {
	store Store
	cfg   Config
}

// New returns a Guard on store.
func New(store Store, cfg Config) (*Guard, error) {
	if nilcheck.IsNil(store) {
		return nil, idemq.NewConfigError(component, "Store", "is nil (%T); pass the store its constructor returned, after checking its error", store)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Guard{store: store, cfg: cfg}, nil
}

// Config returns the configuration with its defaults filled in.
func (g *Guard) Config() Config { return g.cfg }

// Store returns the store the Guard runs on.
func (g *Guard) Store() Store { return g.store }

// MaxResponse returns the largest encoded response the store keeps, or 0
// when it keeps responses of any size (see [ResponseLimiter]).
func (g *Guard) MaxResponse() int {
	if l, ok := g.store.(ResponseLimiter); ok {
		return l.MaxResponse()
	}
	return 0
}

// fit returns resp as the store can keep it: without its body (counted in
// Omitted), and then without its headers, when its encoding is over the
// store's limit.
func (g *Guard) fit(resp Response) Response {
	limit := g.MaxResponse()
	for _, trim := range []func(*Response){
		func(r *Response) { r.Omitted, r.Body = r.Omitted+len(r.Body), nil },
		func(r *Response) { r.Header = nil },
	} {
		if b, err := resp.MarshalBinary(); limit == 0 || err != nil || len(b) <= limit {
			return resp
		}
		trim(&resp)
	}
	return resp
}

// ErrUnavailable is matched by the errors of a store that failed or did
// not answer in time. Front ends answer 503 / UNAVAILABLE and never run
// the request unprotected (fail closed).
var ErrUnavailable = errors.New("request: store unavailable")

// unavailable wraps a store error so that it matches both ErrUnavailable
// and the store's own error.
func unavailable(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// InFlightError reports that another attempt holds the key. The client
// may retry later with the same key.
type InFlightError struct {
	ID ID
	// LeaseUntil is when the holder's lease runs out unless renewed: the
	// latest moment a crashed holder still blocks the key.
	LeaseUntil time.Time
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("request: key %q of scope %q is in flight until %s", e.ID.Key, e.ID.Scope, e.LeaseUntil.Format(time.RFC3339Nano))
}

// RetryAfter suggests when to retry: the rest of the holder's lease, but
// at most one second, since most requests finish far sooner than a lease.
func (e *InFlightError) RetryAfter() time.Duration {
	return max(0, min(time.Until(e.LeaseUntil), time.Second))
}

// Decision is the outcome of [Guard.Begin]: exactly one field is set.
type Decision struct {
	// Run is the caller's attempt: run the request, then Complete or
	// Release it.
	Run *Attempt
	// Replay is the completed record whose response answers the request.
	Replay *Record
}

// Begin checks id and claims it for an attempt. The errors are an
// ErrInvalidKey (the client sent a bad key), an ErrMisconfigured (the
// server's scope or fingerprint is unfit), a *ConflictError (the key
// belongs to another request), an *InFlightError (another attempt holds
// the key, also after Wait) or an ErrUnavailable (the store failed).
//
// The attempt's lease is renewed until it is finished or ctx is done: a
// request whose client went away or whose deadline passed stops holding
// its key after one more Lease.
func (g *Guard) Begin(ctx context.Context, id ID, fingerprint []byte) (Decision, error) {
	if err := g.cfg.Keys.Check(id); err != nil {
		return Decision{}, err
	}
	if err := CheckFingerprint(fingerprint); err != nil {
		return Decision{}, err
	}
	var deadline time.Time
	if g.cfg.Wait > 0 {
		deadline = time.Now().Add(g.cfg.Wait)
	}
	var inFlight *InFlightError // once a claim found the key held
	for poll := 1; ; poll++ {
		c, err := g.claim(ctx, id, fingerprint)
		if err != nil && inFlight != nil && ctx.Err() != nil {
			return Decision{}, inFlight // the caller stopped waiting mid-claim
		}
		if err != nil {
			return Decision{}, err
		}
		if c.Acquired {
			return Decision{Run: g.start(ctx, c.Lease)}, nil
		}
		if c.Record.State == Completed {
			return Decision{Replay: &c.Record}, nil
		}
		inFlight = &InFlightError{ID: id, LeaseUntil: c.Record.LeaseUntil}
		left := time.Until(deadline)
		if left <= 0 {
			return Decision{}, inFlight
		}
		if err := lifecycle.Sleep(ctx, min(left, g.cfg.Retry.Delay(poll, 0))); err != nil {
			return Decision{}, inFlight
		}
	}
}

func (g *Guard) claim(ctx context.Context, id ID, fingerprint []byte) (Claim, error) {
	ctx, cancel := g.storeContext(ctx)
	defer cancel()
	c, err := bounded(ctx, func(ctx context.Context) (Claim, error) {
		return g.store.Claim(ctx, id, fingerprint, g.cfg.Lease)
	}, func(c Claim, err error) {
		if err == nil && c.Acquired { // hand back at once a key nobody runs
			ctx, cancel := g.storeContext(context.Background())
			defer cancel()
			_ = g.store.Release(ctx, c.Lease)
		}
	})
	if conflict := (*ConflictError)(nil); err != nil && !errors.As(err, &conflict) && !errors.Is(err, ErrInvalidKey) && !errors.Is(err, ErrMisconfigured) {
		return c, unavailable("claim", err)
	}
	return c, err
}

// storeContext bounds one store call by StoreTimeout.
func (g *Guard) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, g.cfg.StoreTimeout)
}

// bounded returns call's outcome, or ctx's error as soon as ctx is done:
// a store that ignores its context (a driver stuck on a dead connection)
// must not keep a request waiting forever. The call goes on alone; if it
// returns after all, drop (if not nil) gets its outcome, to undo what
// nobody will finish.
func bounded[T any](ctx context.Context, call func(context.Context) (T, error), drop func(T, error)) (T, error) {
	type outcome struct {
		v   T
		err error
	}
	done, abandoned := make(chan outcome), make(chan struct{})
	go func() {
		v, err := call(ctx)
		select {
		case done <- outcome{v, err}:
		case <-abandoned:
			if drop != nil {
				drop(v, err)
			}
		}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		close(abandoned)
		var zero T
		return zero, context.Cause(ctx)
	}
}

// boundedErr is bounded for a call that returns only an error.
func boundedErr(ctx context.Context, call func(context.Context) error) error {
	_, err := bounded(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) }, nil)
	return err
}

// Attempt is one run of a request under a lease. Finish it with exactly
// one of Complete or Release; CompleteWith may come before Release.
type Attempt struct {
	g      *Guard
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() error // ends the renewals

	mu    sync.Mutex
	lease idemq.Lease
}

// start begins renewing lease in the background.
func (g *Guard) start(ctx context.Context, lease idemq.Lease) *Attempt {
	a := &Attempt{g: g, lease: lease}
	a.ctx, a.cancel = context.WithCancelCause(ctx)
	a.stop = lifecycle.KeepAlive(a.ctx, g.cfg.Lease/3, a.renew)
	return a
}

// renew extends the lease once; KeepAlive calls it every Lease/3 until the
// attempt halts. A failed extension is tried again at the next tick: the
// lease still has two thirds of its time. An extension that hangs must not
// eat the lease it renews: KeepAlive gives it a third of it, StoreTimeout
// may give less.
func (a *Attempt) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.g.cfg.StoreTimeout)
	defer cancel()
	lease, err := bounded(ctx, func(ctx context.Context) (idemq.Lease, error) { return a.g.store.Extend(ctx, a.Lease(), a.g.cfg.Lease) }, nil)
	switch {
	case err == nil:
		a.mu.Lock()
		a.lease = lease
		a.mu.Unlock()
	case errors.Is(err, idemq.ErrLeaseLost):
		a.cancel(idemq.ErrLeaseLost)
	}
	return err
}

// Lease returns the attempt's current lease.
func (a *Attempt) Lease() idemq.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lease
}

// Context is the context to run the request under: Begin's context,
// cancelled with the cause idemq.ErrLeaseLost (see context.Cause) when a renewal
// finds the key taken over, because the attempt's outcome will be refused
// and its work should stop. It ends when the attempt is finished.
func (a *Attempt) Context() context.Context { return a.ctx }

// halt stops renewal and waits for it, so that no extension races the
// finish.
func (a *Attempt) halt() {
	_ = a.stop() // a loss already cancelled the attempt's context
}

// end halts the attempt and releases its context.
func (a *Attempt) end() {
	a.halt()
	a.cancel(nil)
}

// finishContext outlives the request's context: an outcome must be stored
// even when the client went away.
func (a *Attempt) finishContext() (context.Context, context.CancelFunc) {
	return a.g.storeContext(context.WithoutCancel(a.ctx))
}

// Complete stores resp as the request's outcome; a response over the
// store's limit ([ResponseLimiter]) is stored without its body, marked
// Omitted. It returns idemq.ErrLeaseLost when the key was taken over meanwhile
// (the successor's outcome stands), also after its record expired and a
// new claim created it again (tokens never go back), or an ErrUnavailable.
func (a *Attempt) Complete(resp Response) error {
	defer a.end()
	a.halt()
	ctx, cancel := a.finishContext()
	defer cancel()
	lease, resp := a.Lease(), a.g.fit(resp)
	return a.g.finishErr("complete", boundedErr(ctx, func(ctx context.Context) error { return a.g.store.Complete(ctx, lease, resp) }))
}

// CompleteWith stops renewing the lease and calls complete with it, for an
// outcome stored by the caller: in its own transaction, with
// pgstore.Store.CompleteTx, so that the request's writes and its record
// commit together. Call Release afterwards: it hands the key back if that
// transaction rolled back, and returns idemq.ErrLeaseLost if it committed.
func (a *Attempt) CompleteWith(complete func(idemq.Lease) error) error {
	a.halt()
	return complete(a.Lease())
}

// Release hands the key back without an outcome, so that a retry runs the
// request again. It returns idemq.ErrLeaseLost when the key was taken over or
// completed (also after its record expired, as for Complete), or an
// ErrUnavailable.
func (a *Attempt) Release() error {
	defer a.end()
	a.halt()
	ctx, cancel := a.finishContext()
	defer cancel()
	lease := a.Lease()
	return a.g.finishErr("release", boundedErr(ctx, func(ctx context.Context) error { return a.g.store.Release(ctx, lease) }))
}

func (g *Guard) finishErr(op string, err error) error {
	if err == nil || errors.Is(err, idemq.ErrLeaseLost) {
		return err
	}
	return unavailable(op, err)
}

// Get returns the record of id, or ErrNotFound, or an ErrUnavailable.
func (g *Guard) Get(ctx context.Context, id ID) (Record, error) {
	ctx, cancel := g.storeContext(ctx)
	defer cancel()
	rec, err := bounded(ctx, func(ctx context.Context) (Record, error) { return g.store.Get(ctx, id) }, nil)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return rec, unavailable("get", err)
	}
	return rec, err
}
