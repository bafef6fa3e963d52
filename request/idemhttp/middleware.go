package idemhttp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	nethttp "net/http"
	"slices"
	"strings"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
)

// Config configures a [Middleware]. The zero value is valid.
type Config struct {
	// Guard configures the leases (renewed while the handler runs), an
	// optional bounded wait for a request in flight instead of an
	// immediate 409, the store timeout and the key format limits (255
	// bytes by default; UUID or ULID optional). Defaults as in package
	// request.
	Guard request.Config
	// Methods are the protected methods. Defaults to POST and PATCH.
	Methods []string
	// Protect decides which requests are protected, for per-route opt-in
	// or opt-out (to protect just some routes, wrap just those). Defaults
	// to: the method is one of Methods.
	Protect func(r *nethttp.Request) bool
	// Optional lets a protected request without a key run unprotected.
	// Defaults to false: such a request gets a 400.
	Optional bool
	// Strict accepts only keys sent as sf-strings (quoted), as the IETF
	// draft requires. Defaults to false: a bare key such as Stripe's
	// clients send is accepted too.
	Strict bool
	// Scope returns the tenant or principal a request's key belongs to,
	// so that one client's key can never replay another client's
	// response. Run authentication before the middleware. It must return
	// printable ASCII of at most request.MaxScopeLen (128) bytes (hash a
	// longer or non-ASCII name); anything else is a 500
	// ([ProblemMisconfigured]) with the reason logged, since the client
	// cannot fix it. Defaults to one scope for all clients: then keys must
	// be unguessable.
	Scope func(r *nethttp.Request) string
	// Fingerprint tells apart two requests with one key; a key reused
	// with another fingerprint is a 422. It gets the request body, which
	// it must not keep, and returns a digest of at most
	// request.MaxFingerprintLen (64) bytes: New refuses one that returns
	// more for an empty POST, and a longer one at run time is a 500 with
	// the reason logged. Defaults to [FingerprintDefault].
	Fingerprint func(r *nethttp.Request, body []byte) []byte
	// MaxBody bounds the request body read to fingerprint it; a larger
	// body is a 413. Defaults to 1 MiB.
	MaxBody int64
	// MaxResponse bounds the response body buffered and stored for
	// replay. A larger response is sent as it is produced, and its key is
	// completed without the body: a retry gets a 410
	// ([ProblemResponseNotKept]) that says the outcome stands, never an
	// empty body passed off as the original. The Postgres store keeps
	// bodies of any size, so raise it there for large responses; a store
	// with a limit of its own (DynamoDB, about 396 KB) refuses a larger
	// MaxResponse. Defaults to 1 MiB, or the store's limit if lower.
	MaxResponse int
	// Final decides whether an outcome is stored and replayed to every
	// retry (true) or releases the key so that a retry runs the handler
	// again (false). Panics always release. Defaults to [FinalDefault];
	// [FinalAll] stores every response as Stripe does.
	Final func(Outcome) bool
	// ReplayHeaders are the response headers stored and replayed.
	// Set-Cookie, Date and rate-limit headers are refused: they belong to
	// one response, not to the operation. Defaults to
	// ReplayHeadersDefault.
	ReplayHeaders []string
	// Timeout bounds the handler: its context gets this deadline and the
	// lease is renewed no longer. Defaults to 0: no deadline.
	Timeout time.Duration
	// OwnTransaction runs each protected request in a transaction the
	// middleware owns, on a store that can (a request.TxStore: pgstore):
	// the key is claimed by the transaction's first statement, the
	// handler writes its effects in it (pgstore.Tx(r.Context())), and the
	// response is stored in it before it commits once, so the effects and
	// the record commit together or not at all. A duplicate waits for the
	// first request's transaction up to Guard.Wait (at least
	// request.TxWaitMin, a second), then gets the committed response
	// replayed, or a 409.
	// A response that Final does not keep (a 5xx), a panic and a failed
	// statement roll the whole transaction back. Choose it when the
	// handler's effects are all in that database; effects elsewhere (an
	// HTTP call, an email) need the default leased mode. Defaults to
	// false.
	OwnTransaction bool
	// Hooks observe every protected request.
	Hooks Hooks
	// Logger receives the reason of every 500 the middleware answers for
	// a server misconfiguration ([ProblemMisconfigured]). Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	MaxBodyDefault     = 1 << 20
	MaxResponseDefault = 1 << 20
)

// Defaults of Config.
var (
	MethodsDefault = []string{nethttp.MethodPost, nethttp.MethodPatch}
	// ReplayHeadersDefault describe the stored representation and where
	// it lives; none of them is specific to one response.
	ReplayHeadersDefault = []string{"Content-Type", "Content-Language", "Content-Encoding",
		"Content-Location", "Location", "ETag", "Last-Modified", "Link"}
)

// neverReplayed are headers that describe one response, not the
// operation; replaying them would hand out a session or a stale quota.
func neverReplayed(name string) bool {
	name = nethttp.CanonicalHeaderKey(name)
	return name == "Set-Cookie" || name == "Set-Cookie2" || name == "Date" || name == "Retry-After" ||
		name == "Content-Length" || strings.HasPrefix(name, "Ratelimit") || strings.HasPrefix(name, "X-Ratelimit")
}

// Outcome is what a handler produced, as the Final policy sees it.
type Outcome struct {
	// Status is the response status (200 if the handler wrote none).
	Status int
	// Timeout reports that the handler's deadline (Config.Timeout or the
	// server's) had passed when it returned.
	Timeout bool
	// ClientGone reports that the client had gone away when the handler
	// returned.
	ClientGone bool
	// Written reports that the handler wrote a status or a body. One that
	// returned without writing anything after its context ended most
	// likely gave up before its work was done.
	Written bool
}

// FinalDefault stores 2xx and 4xx responses, which a retry of the same
// request would get again, except 408, 409, 425 and 429, which say "try
// again", whether or not the client is still there: once the handler has
// produced a final response its work is done, and the retry must get that
// response rather than run it again. 5xx responses release the key, and so
// does a handler that wrote nothing when its deadline passed or its client
// went away: it may not have done its work, and the retry runs it. A
// handler whose failure may have left work done should return 2xx or 4xx,
// or complete in its own transaction with [Record].
func FinalDefault(o Outcome) bool {
	if (o.Timeout || o.ClientGone) && !o.Written {
		return false
	}
	switch o.Status {
	case nethttp.StatusRequestTimeout, nethttp.StatusConflict, nethttp.StatusTooEarly, nethttp.StatusTooManyRequests:
		return false
	}
	return o.Status >= 200 && o.Status < 500
}

// FinalAll stores every response, 5xx included, as Stripe does: the first
// outcome is the answer to every retry.
func FinalAll(Outcome) bool { return true }

// Hooks observe a Middleware. Hooks run on the request's goroutine; keep
// them fast.
type Hooks struct {
	// OnResult is called once for every protected request.
	OnResult func(ResultEvent)
}

// ResultEvent describes one protected request.
type ResultEvent struct {
	Request *nethttp.Request
	// ID is the scoped key, empty if the key was missing or malformed.
	ID     request.ID
	Result request.Result
	// Status is the status code sent.
	Status int
	// Token is the fencing token of the attempt that ran the handler.
	Token int64
	// Err is the error behind Rejected, Conflict, InFlight, Unavailable,
	// Fenced and StoreFailed.
	Err error
}

const component = "http.Middleware"

func (c Config) withDefaults() Config {
	if c.Methods == nil {
		c.Methods = MethodsDefault
	}
	if c.Protect == nil {
		methods := c.Methods
		c.Protect = func(r *nethttp.Request) bool { return slices.Contains(methods, r.Method) }
	}
	if c.Scope == nil {
		c.Scope = func(*nethttp.Request) string { return "" }
	}
	if c.Fingerprint == nil {
		c.Fingerprint = FingerprintDefault
	}
	c.MaxBody = cmp.Or(c.MaxBody, MaxBodyDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Final == nil {
		c.Final = FinalDefault
	}
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = ReplayHeadersDefault
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxBody < 0:
		return idemq.NewConfigError(component, "MaxBody", "%d is negative", c.MaxBody)
	case c.MaxResponse < 0:
		return idemq.NewConfigError(component, "MaxResponse", "%d is negative", c.MaxResponse)
	case c.Timeout < 0:
		return idemq.NewConfigError(component, "Timeout", "%v is negative", c.Timeout)
	}
	for _, h := range c.ReplayHeaders {
		if neverReplayed(h) {
			return idemq.NewConfigError(component, "ReplayHeaders", "%s must not be replayed: it belongs to one response", h)
		}
	}
	return nil
}

// Middleware answers every protected request whose Idempotency-Key was
// seen before with the stored response, and runs the handler at most once
// per key and scope. It is safe for concurrent use.
type Middleware struct {
	guard  *request.Guard
	cfg    Config
	replay map[string]bool
}

// New returns a Middleware on store.
func New(store request.Store, cfg Config) (*Middleware, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	guard, err := request.New(store, cfg.Guard)
	if err != nil {
		return nil, err
	}
	if limit := guard.MaxResponse(); cfg.MaxResponse == 0 {
		cfg.MaxResponse = MaxResponseDefault
		if limit > 0 {
			cfg.MaxResponse = min(MaxResponseDefault, limit)
		}
	} else if limit > 0 && cfg.MaxResponse > limit {
		return nil, idemq.NewConfigError(component, "MaxResponse", "%d is over the %d bytes the %T keeps per response; lower it, or use the Postgres store for large responses", cfg.MaxResponse, limit, store)
	}
	if _, ok := store.(request.TxStore); cfg.OwnTransaction && !ok {
		return nil, idemq.NewConfigError(component, "OwnTransaction", "the %T cannot run requests in their transaction; use pgstore, or the leased mode", store)
	}
	if err := probeFingerprint(cfg.Fingerprint); err != nil {
		return nil, err
	}
	replay := map[string]bool{}
	for _, h := range cfg.ReplayHeaders {
		replay[nethttp.CanonicalHeaderKey(h)] = true
	}
	return &Middleware{guard: guard, cfg: cfg, replay: replay}, nil
}

// probeFingerprint calls fingerprint with an empty POST /, so that one
// returning more than a digest is refused at startup rather than on every
// request. A function that needs more of a request than that (it panics)
// is judged per request.
func probeFingerprint(fingerprint func(*nethttp.Request, []byte) []byte) (err error) {
	defer func() {
		if recover() != nil {
			err = nil
		}
	}()
	r, _ := nethttp.NewRequestWithContext(context.Background(), nethttp.MethodPost, "/", nethttp.NoBody)
	if err := request.CheckFingerprint(fingerprint(r, nil)); err != nil {
		return idemq.NewConfigError(component, "Fingerprint", "%v", err)
	}
	return nil
}

// Response headers the middleware sets.
const (
	// HeaderReplayed marks a replayed response: "Idempotent-Replayed: true"
	// (Stripe's header).
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderExpires advertises, on every stored and replayed response,
	// the HTTP-date until which the key is kept at least: a retry before
	// then gets this response, one after may run the request again.
	HeaderExpires = "Idempotency-Key-Expires"
)

// Wrap protects next: it is a func(http.Handler) http.Handler.
func (m *Middleware) Wrap(next nethttp.Handler) nethttp.Handler {
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		if !m.cfg.Protect(r) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

func (m *Middleware) report(ev ResultEvent) {
	if m.cfg.Hooks.OnResult != nil {
		m.cfg.Hooks.OnResult(ev)
	}
}

func (m *Middleware) serve(w nethttp.ResponseWriter, r *nethttp.Request, next nethttp.Handler) {
	ev := ResultEvent{Request: r}
	defer func() { m.report(ev) }()
	// reject answers with a problem; its detail is the error's text
	// unless detail says otherwise.
	reject := func(result request.Result, typ string, status int, err error, detail string, retryAfter time.Duration) {
		ev.Result, ev.Status, ev.Err = result, status, err
		writeProblem(w, typ, status, ev.ID.Key, cmp.Or(detail, errText(err)), retryAfter)
	}

	key, err := parseKey(r.Header, m.cfg.Strict)
	switch {
	case errors.Is(err, errNoKey) && m.cfg.Optional:
		ev.Result = request.ResultUnprotected
		next.ServeHTTP(w, r)
		return
	case errors.Is(err, errNoKey):
		reject(request.ResultRejected, ProblemKeyMissing, nethttp.StatusBadRequest, err, "", 0)
		return
	case err != nil:
		reject(request.ResultRejected, ProblemKeyMalformed, nethttp.StatusBadRequest, err, "", 0)
		return
	}
	ev.ID = request.ID{Scope: m.cfg.Scope(r), Key: key}

	body, err := io.ReadAll(nethttp.MaxBytesReader(nil, r.Body, m.cfg.MaxBody))
	if err != nil {
		if tooLarge := (*nethttp.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			reject(request.ResultRejected, ProblemBodyTooLarge, nethttp.StatusRequestEntityTooLarge, err, "", 0)
			return
		}
		ev.Result, ev.Err = request.ResultRejected, err
		nethttp.Error(w, "reading the request body: "+err.Error(), nethttp.StatusBadRequest)
		return
	}

	ctx := r.Context()
	if m.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.Timeout)
		defer cancel()
	}
	if m.cfg.OwnTransaction {
		m.serveTx(ctx, w, r, next, body, &ev, reject)
		return
	}
	d, err := m.guard.Begin(ctx, ev.ID, m.cfg.Fingerprint(r, body))
	if err != nil {
		m.rejectBegin(r, err, reject)
		return
	}
	if d.Replay != nil {
		ev.Result, ev.Status = request.ResultReplayed, m.replayRecord(w, *d.Replay)
		return
	}

	a := d.Run
	ev.Token = a.Lease().Token
	c := newCapture(w, m.cfg.MaxResponse)
	st := &state{attempt: a, capture: c, m: m}
	r2 := r.WithContext(context.WithValue(a.Context(), stateKey{}, st))
	r2.Body = io.NopCloser(bytes.NewReader(body))
	defer func() {
		if v := recover(); v != nil {
			// The key is handed back and the panic goes on to the server,
			// which aborts the response.
			ev.Result, ev.Err = request.ResultReleased, fmt.Errorf("handler panicked: %v", v)
			_ = a.Release()
			panic(v)
		}
	}()
	next.ServeHTTP(c, r2)
	m.finish(ctx, r, st, &ev)
}

// rejectBegin answers a Begin error.
func (m *Middleware) rejectBegin(r *nethttp.Request, err error, reject func(request.Result, string, int, error, string, time.Duration)) {
	var conflict *request.ConflictError
	var inFlight *request.InFlightError
	switch {
	case errors.Is(err, request.ErrMisconfigured):
		m.cfg.Logger.ErrorContext(r.Context(), "idempotency middleware: refused a request with 500: the server's configuration is broken",
			"err", err, "method", r.Method, "path", r.URL.Path)
		reject(request.ResultMisconfigured, ProblemMisconfigured, nethttp.StatusInternalServerError, err,
			"the server could not protect this request because of its own configuration; the request was not run and the operator's log says why", 0)
	case errors.Is(err, request.ErrInvalidKey):
		reject(request.ResultRejected, ProblemKeyMalformed, nethttp.StatusBadRequest, err, "", 0)
	case errors.As(err, &conflict):
		reject(request.ResultConflict, ProblemKeyReused, nethttp.StatusUnprocessableEntity, err,
			"the key was first used for a request with another method, route, query or body", 0)
	case errors.As(err, &inFlight):
		reject(request.ResultInFlight, ProblemInFlight, nethttp.StatusConflict, err,
			"the first request with this key is still running; retry with the same key after Retry-After seconds",
			max(inFlight.RetryAfter(), time.Second))
	default:
		reject(request.ResultUnavailable, ProblemUnavailable, nethttp.StatusServiceUnavailable, err,
			"the idempotency key store cannot be reached, so the request was not run; retry with the same key", time.Second)
	}
}

// errText is the detail of a problem about the client's key: the error
// without its package prefix.
func errText(err error) string {
	return strings.TrimPrefix(err.Error(), "request: ")
}

// finish stores or releases the outcome of the handler and sends the
// response.
func (m *Middleware) finish(ctx context.Context, r *nethttp.Request, st *state, ev *ResultEvent) {
	c, a := st.capture, st.attempt
	ev.Status = c.statusOr()
	var err error
	switch {
	case st.recorded:
		// The handler stored its outcome in its own transaction; if that
		// rolled back, or Record failed, this hands the key back.
		ev.Result, err = request.ResultReleased, a.Release()
		released := err == nil
		if errors.Is(err, idemq.ErrLeaseLost) && c.recorded {
			ev.Result, err = request.ResultCompleted, nil
		}
		if released && c.recorded && !c.overflow {
			// Recorded, yet the record did not commit: the response
			// describes writes that were rolled back.
			ev.Status = nethttp.StatusInternalServerError
			writeProblem(c.w, ProblemNotCommitted, ev.Status, ev.ID.Key,
				"the request's transaction did not commit, so nothing was done; retry with the same key", 0)
			return
		}
	case m.cfg.Final(Outcome{Status: ev.Status, Timeout: errors.Is(ctx.Err(), context.DeadlineExceeded),
		ClientGone: errors.Is(r.Context().Err(), context.Canceled), Written: c.status != 0}):
		ev.Result, err = request.ResultCompleted, a.Complete(m.response(c))
	default:
		ev.Result, err = request.ResultReleased, a.Release()
	}
	switch {
	case errors.Is(err, idemq.ErrLeaseLost):
		// Taken over while the handler ran: the successor's outcome
		// stands, and is the answer if it is there yet.
		ev.Result, ev.Err = request.ResultFenced, err
		if c.overflow {
			return
		}
		if rec, err := m.guard.Get(context.WithoutCancel(r.Context()), ev.ID); err == nil && rec.State == request.Completed {
			ev.Status = m.replayRecord(c.w, rec)
			return
		}
		ev.Status = nethttp.StatusConflict
		writeProblem(c.w, ProblemInFlight, nethttp.StatusConflict, ev.ID.Key,
			"this request's lease was taken over by a retry; its outcome stands", time.Second)
		return
	case err != nil && !errors.Is(err, idemq.ErrLeaseLost):
		// The work is done; the client gets its response even though the
		// record failed. A retry after the lease may run the handler again.
		ev.Result, ev.Err = request.ResultStoreFailed, err
	}
	var extra nethttp.Header
	if ev.Result == request.ResultCompleted {
		extra = nethttp.Header{HeaderExpires: {time.Now().Add(m.guard.Store().RecordTTL()).UTC().Format(nethttp.TimeFormat)}}
	}
	c.send(extra)
}

// response is the stored form of a captured response: the status, the
// allow-listed headers and the body (nil if it overflowed).
func (m *Middleware) response(c *capture) request.Response {
	resp := request.Response{Status: c.statusOr(), Header: map[string][]string{}}
	for k, v := range c.header {
		if m.replay[k] {
			resp.Header[k] = v
		}
	}
	if c.overflow {
		resp.Omitted = c.size
	} else {
		resp.Body = c.body.Bytes()
	}
	return resp
}

// replayRecord answers with a stored response and returns the status
// sent. A response whose body was not kept is answered with
// [ProblemResponseNotKept] and its Location, never with an empty body.
func (m *Middleware) replayRecord(w nethttp.ResponseWriter, rec request.Record) int {
	resp := rec.Response
	h := w.Header()
	if resp.Omitted > 0 {
		h.Set(HeaderReplayed, "true")
		h.Set(HeaderExpires, rec.ExpiresAt.UTC().Format(nethttp.TimeFormat))
		if loc := resp.Header["Location"]; m.replay["Location"] && len(loc) > 0 {
			h.Set("Location", loc[0])
		}
		p := problem{Type: ProblemResponseNotKept, Title: titles[ProblemResponseNotKept], Status: nethttp.StatusGone, Key: rec.Key, OriginalStatus: resp.Status,
			Detail: fmt.Sprintf("the request with this key ran and answered %d, but its body of %d bytes was over the size kept for replay; do not retry it, read the result another way (see Location, if any)", resp.Status, resp.Omitted)}
		p.write(w, 0)
		return p.Status
	}
	for k, v := range resp.Header {
		if m.replay[k] {
			h[k] = v
		}
	}
	h.Set(HeaderReplayed, "true")
	h.Set(HeaderExpires, rec.ExpiresAt.UTC().Format(nethttp.TimeFormat))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
	return resp.Status
}

// state is what a protected handler can reach through its request's
// context.
type state struct {
	m        *Middleware
	attempt  *request.Attempt
	capture  *capture
	recorded bool
}

type stateKey struct{}

// Lease returns the lease under which r's handler runs, for a handler
// that passes the fencing token downstream. ok is false outside a
// protected request.
func Lease(r *nethttp.Request) (lease idemq.Lease, ok bool) {
	st, ok := r.Context().Value(stateKey{}).(*state)
	if !ok {
		return idemq.Lease{}, false
	}
	return st.attempt.Lease(), true
}

// ErrNotProtected is returned by [Record] outside a protected request,
// and in the transaction-owning mode (Config.OwnTransaction), where the
// middleware stores the response in the request's transaction itself.
var ErrNotProtected = errors.New("http: the request is not protected by the idempotency middleware")

// Record stores the response the handler has written so far as the
// request's outcome through complete, and returns complete's error. Use
// it to commit the request record in the handler's own transaction, so
// that "applied" and "recorded" cannot diverge:
//
//	// write the response first, then, before tx.Commit:
//	err := idemhttp.Record(r, func(l idemq.Lease, resp request.Response) error {
//		return store.CompleteTx(ctx, tx, l, resp) // pgstore.Store
//	})
//
// If complete returns idemq.ErrLeaseLost, another attempt took the key
// over: roll back. The response is sent when the handler returns;
// writing after Record fails with [ErrRecorded]. If Record fails, the
// response written so far is discarded, so that the handler can answer
// with an error instead. Once Record was called the middleware stores
// nothing itself: if the transaction rolls back after all, or Record
// failed, the key is handed back for a retry when the handler returns; a
// recorded response whose transaction rolled back is replaced by a 500
// ([ProblemNotCommitted]).
func Record(r *nethttp.Request, complete func(idemq.Lease, request.Response) error) error {
	st, ok := r.Context().Value(stateKey{}).(*state)
	if !ok {
		return ErrNotProtected
	}
	if st.recorded {
		return ErrRecorded
	}
	st.recorded = true
	resp := st.m.response(st.capture)
	err := st.attempt.CompleteWith(func(l idemq.Lease) error { return complete(l, resp) })
	if err != nil {
		st.capture.reset()
		return err
	}
	st.capture.recorded = true
	return nil
}
