package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// ServerConfig configures [UnaryServerInterceptor].
type ServerConfig struct {
	// Guard configures the leases (renewed while the handler runs), an
	// optional bounded wait for a call in flight instead of an immediate
	// ABORTED, the store timeout and the key format limits (255 bytes by
	// default; UUID or ULID optional). Defaults as in package request.
	Guard request.Config
	// Methods lists the full method names ("/orders.v1.Orders/CreateOrder")
	// that require a key and run at most once per key. Their generated
	// code must be linked in: replays decode the stored response into the
	// method's output type, found in the protobuf registry. Only unary
	// methods can be listed: a streaming call never passes a unary
	// interceptor, so it would run unprotected. Other methods pass through
	// (a key they carry still derives downstream keys). Required.
	Methods []string
	// Scope names the principal or tenant of a call, so that one client's
	// key can never replay another client's response. Run authentication
	// before this interceptor. An error it returns goes to the client as
	// is (return a status error such as UNAUTHENTICATED). A scope must be
	// printable ASCII of at most request.MaxScopeLen (128) bytes; anything
	// else is INTERNAL with the reason logged, since the client cannot fix
	// it. Defaults to one scope for all clients: then keys must be
	// unguessable.
	Scope func(ctx context.Context) (string, error)
	// Fingerprint tells requests apart: a key reused with a request of
	// another fingerprint is refused with FAILED_PRECONDITION. It returns
	// a digest of at most request.MaxFingerprintLen (64) bytes: the
	// constructor refuses one that returns more for an empty request of a
	// protected method, and a longer one at run time is INTERNAL with the
	// reason logged. Defaults to [FingerprintDefault].
	Fingerprint func(ctx context.Context, method string, req proto.Message) ([]byte, error)
	// Final decides whether a handler's outcome (err is nil on success)
	// is stored and replayed to every retry (true) or releases the key so
	// that a retry runs the handler again (false). Panics always release.
	// Defaults to [FinalDefault]; [FinalAll] stores every outcome as
	// Stripe does.
	Final func(err error) bool
	// OwnTransaction runs each protected call in a transaction the
	// interceptor owns, on a store that can (a request.TxStore: pgstore):
	// the key is claimed by the transaction's first statement, the
	// handler writes its effects in it (pgstore.Tx(ctx)), and the outcome
	// is stored in it before it commits once, so the effects and the
	// record commit together or not at all. A duplicate waits for the
	// first call's transaction up to Guard.Wait (at least
	// request.TxWaitMin, a second), then gets the committed outcome
	// replayed, or ABORTED. An outcome that Final does not keep, a panic
	// and a failed statement roll the whole transaction back. Choose it
	// when the handler's effects are all in that database; effects
	// elsewhere need the default leased mode. Defaults to false.
	OwnTransaction bool
	// Hooks observe every call of the protected methods.
	Hooks ServerHooks
	// Logger receives the reason of every INTERNAL the interceptor answers
	// for a server misconfiguration. Defaults to slog.Default().
	Logger *slog.Logger
}

// ReleaseCodes are the codes on which [FinalDefault] releases the key:
// the call did not finish, or failed in a way that a retry may not (HTTP's
// 5xx, 408, 409 and 429). A plain Go error is UNKNOWN.
var ReleaseCodes = []codes.Code{
	codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted,
	codes.Aborted, codes.Internal, codes.Unavailable,
}

// FinalDefault stores successes and errors that a retry of the same
// request would get again (INVALID_ARGUMENT, NOT_FOUND, ...), and releases
// the key on [ReleaseCodes]. A handler whose failure may have left work
// done should return a final code, or record its outcome in its own
// transaction with [Record].
func FinalDefault(err error) bool { return !slices.Contains(ReleaseCodes, status.Code(err)) }

// FinalAll stores every outcome, as Stripe does: the first outcome is the
// answer to every retry.
func FinalAll(error) bool { return true }

// FingerprintDefault is SHA-256 of the method and the deterministic
// protobuf encoding of the request. Deterministic is not canonical: two
// encoders (another language, another protobuf version, unknown fields
// kept by a proxy) may encode one message differently, so set
// ServerConfig.Fingerprint to a digest of chosen fields when clients are
// built apart.
func FingerprintDefault(_ context.Context, method string, req proto.Message) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, err
	}
	return request.Fingerprint([]byte(method), body), nil
}

// ServerHooks observe the server interceptor. They run on the call's
// goroutine; keep them fast.
type ServerHooks struct {
	// OnResult is called once for every call of a protected method.
	OnResult func(ResultEvent)
}

// ResultEvent describes one call of a protected method.
type ResultEvent struct {
	Method string
	// ID is the scoped key, empty if the key was missing or malformed.
	ID     request.ID
	Result request.Result
	// Code is the status code sent.
	Code codes.Code
	// Token is the fencing token of the attempt that ran the handler.
	Token int64
	// Err is the error behind Rejected, Conflict, InFlight, Unavailable,
	// Fenced and StoreFailed.
	Err error
}

// Error reasons, in the google.rpc.ErrorInfo detail of the interceptor's
// own errors (domain [ErrorDomain]).
const (
	ErrorDomain            = "idemq"
	ReasonKeyMissing       = "IDEMPOTENCY_KEY_MISSING"
	ReasonKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	ReasonInFlight         = "IDEMPOTENCY_KEY_IN_FLIGHT"
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonLeaseLost        = "IDEMPOTENCY_LEASE_LOST"
	// ReasonNotCommitted (UNAVAILABLE): in the transaction-owning mode,
	// the call's transaction did not commit, or whether it did is
	// unknown; a retry with the key gets its outcome or runs it.
	ReasonNotCommitted = "IDEMPOTENCY_NOT_COMMITTED"
	// ReasonMisconfigured (INTERNAL): the server's scope or fingerprint, or
	// its store, is set up wrong; the call did not run.
	ReasonMisconfigured = "IDEMPOTENCY_SERVER_MISCONFIGURED"
	// ReasonResponseNotKept (FAILED_PRECONDITION): the call with this key
	// ran and its outcome stands, but its response was too large for the
	// store to keep, so it cannot be replayed. Do not retry.
	ReasonResponseNotKept = "IDEMPOTENCY_RESPONSE_NOT_KEPT"
)

const serverComponent = "grpc.UnaryServerInterceptor"

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Scope == nil {
		c.Scope = func(context.Context) (string, error) { return "", nil }
	}
	if c.Fingerprint == nil {
		c.Fingerprint = FingerprintDefault
	}
	if c.Final == nil {
		c.Final = FinalDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// outputTypes validates Methods and resolves each one's output type.
func (c ServerConfig) outputTypes() (map[string]protoreflect.MessageType, error) {
	if len(c.Methods) == 0 {
		return nil, idemq.NewConfigError(serverComponent, "Methods", "is empty: list the methods to protect")
	}
	types := make(map[string]protoreflect.MessageType, len(c.Methods))
	for _, m := range c.Methods {
		if !validFullMethod(m) {
			return nil, idemq.NewConfigError(serverComponent, "Methods", "%q is not a full method name like /package.Service/Method", m)
		}
		name := protoreflect.FullName(strings.Replace(m[1:], "/", ".", 1))
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
		md, ok := d.(protoreflect.MethodDescriptor)
		if err != nil || !ok {
			return nil, idemq.NewConfigError(serverComponent, "Methods", "%q is not a registered method: import its generated package", m)
		}
		if md.IsStreamingClient() || md.IsStreamingServer() {
			return nil, idemq.NewConfigError(serverComponent, "Methods",
				"%q is a streaming method, which a unary interceptor never sees, so it would run unprotected; remove it, or make it unary", m)
		}
		if err := probeFingerprint(c.Fingerprint, m, md); err != nil {
			return nil, err
		}
		t, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
		if err != nil {
			return nil, idemq.NewConfigError(serverComponent, "Methods", "output %s of %q is not registered: %v", md.Output().FullName(), m, err)
		}
		types[m] = t
	}
	return types, nil
}

// probeFingerprint calls a custom fingerprint with an empty request of md,
// so that one returning more than a digest is refused at startup rather
// than on every call. A function that needs more of a request than that
// (it fails or panics) is judged per call.
func probeFingerprint(fingerprint func(context.Context, string, proto.Message) ([]byte, error), method string, md protoreflect.MethodDescriptor) (err error) {
	in, ferr := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName())
	if fingerprint == nil || ferr != nil {
		return nil
	}
	defer func() {
		if recover() != nil {
			err = nil
		}
	}()
	if fp, ferr := fingerprint(context.Background(), method, in.New().Interface()); ferr == nil {
		if err := request.CheckFingerprint(fp); err != nil {
			return idemq.NewConfigError(serverComponent, "Fingerprint", "%v", err)
		}
	}
	return nil
}

// UnaryServerInterceptor runs each call of the configured methods at most
// once per idempotency key and scope, on store. See the package
// documentation for what a client gets in each case.
func UnaryServerInterceptor(store request.Store, cfg ServerConfig) (grpcgo.UnaryServerInterceptor, error) {
	outputs, err := cfg.outputTypes()
	if err != nil {
		return nil, err
	}
	guard, err := request.New(store, cfg.Guard)
	if err != nil {
		return nil, err
	}
	if _, ok := store.(request.TxStore); cfg.OwnTransaction && !ok {
		return nil, idemq.NewConfigError("grpc.UnaryServerInterceptor", "OwnTransaction", "the %T cannot run calls in their transaction; use pgstore, or the leased mode", store)
	}
	s := &server{guard: guard, cfg: cfg.withDefaults(), outputs: outputs}
	return s.intercept, nil
}

type server struct {
	guard   *request.Guard
	cfg     ServerConfig
	outputs map[string]protoreflect.MessageType
}

func (s *server) intercept(ctx context.Context, req any, info *grpcgo.UnaryServerInfo, handler grpcgo.UnaryHandler) (any, error) {
	output, protected := s.outputs[info.FullMethod]
	key, keyErr := keyOf(ctx, req)
	if !protected {
		if key != "" && keyErr == nil {
			if scope, err := s.cfg.Scope(ctx); err == nil {
				ctx = withInbound(ctx, &inbound{scope: scope, key: key})
			}
		}
		return handler(ctx, req)
	}

	// A panicking handler leaves Code at INTERNAL, what recovery
	// interceptors answer by convention; the hook runs all the same.
	ev := ResultEvent{Method: info.FullMethod, Code: codes.Internal}
	if h := s.cfg.Hooks.OnResult; h != nil {
		defer func() { h(ev) }()
	}
	resp, err := s.serve(ctx, req, info.FullMethod, output, key, keyErr, handler, &ev)
	ev.Code = status.Code(err)
	return resp, err
}

func (s *server) serve(ctx context.Context, req any, method string, output protoreflect.MessageType,
	key string, keyErr error, handler grpcgo.UnaryHandler, ev *ResultEvent) (any, error) {
	reject := func(result request.Result, err, sent error) (any, error) {
		ev.Result, ev.Err = result, err
		return nil, sent
	}
	switch {
	case keyErr != nil:
		return reject(request.ResultRejected, keyErr, rpcError(codes.InvalidArgument, ReasonKeyInvalid, keyErr.Error()))
	case key == "":
		err := errors.New("this method requires an idempotency key: send metadata " + MetadataKey + " or set idempotency_key")
		return reject(request.ResultRejected, err, rpcError(codes.InvalidArgument, ReasonKeyMissing, err.Error()))
	}
	scope, err := s.cfg.Scope(ctx)
	if err != nil {
		return reject(request.ResultRejected, err, err)
	}
	ev.ID = request.ID{Scope: scope, Key: key}
	msg, ok := req.(proto.Message)
	if !ok {
		err := fmt.Errorf("request %T is not a protobuf message", req)
		return reject(request.ResultRejected, err, status.Errorf(codes.Internal, "idempotency: %v", err))
	}
	fp, err := s.cfg.Fingerprint(ctx, method, msg)
	if err != nil {
		return reject(request.ResultRejected, err, status.Errorf(codes.Internal, "idempotency: fingerprint: %v", err))
	}

	rejectBegin := func(err error) (any, error) {
		if errors.Is(err, request.ErrMisconfigured) {
			s.cfg.Logger.ErrorContext(ctx, "idempotency interceptor: refused a call with INTERNAL: the server's configuration is broken",
				"err", err, "method", method)
		}
		result, sent := beginError(ctx, err)
		return reject(result, err, sent)
	}
	if s.cfg.OwnTransaction {
		return s.serveTx(ctx, req, ev.ID, fp, output, handler, ev, rejectBegin)
	}
	d, err := s.guard.Begin(ctx, ev.ID, fp)
	if err != nil {
		return rejectBegin(err)
	}
	if d.Replay != nil {
		ev.Result = request.ResultReplayed
		return replay(ctx, *d.Replay, output)
	}

	a := d.Run
	ev.Token = a.Lease().Token
	hctx, captured := captureMetadata(a.Context())
	in := &inbound{scope: scope, key: key, attempt: a, metadata: captured}
	defer func() {
		if v := recover(); v != nil {
			// The key is handed back and the panic goes on up, to a
			// recovery interceptor or to the process.
			ev.Result, ev.Err = request.ResultReleased, fmt.Errorf("handler panicked: %v", v)
			_ = a.Release()
			panic(v)
		}
	}()
	resp, herr := handler(withInbound(hctx, in), req)
	return s.finish(ctx, in, output, resp, herr, ev)
}

// finish stores the handler's outcome, or releases the key.
func (s *server) finish(ctx context.Context, in *inbound, output protoreflect.MessageType, resp any, herr error, ev *ResultEvent) (any, error) {
	a := in.attempt
	var err error
	switch {
	case in.recorded != nil:
		// The handler stored its outcome in its own transaction; if that
		// rolled back, or Record failed, this hands the key back.
		ev.Result, err = request.ResultReleased, a.Release()
		if errors.Is(err, idemq.ErrLeaseLost) && in.recordedOK {
			ev.Result, err = request.ResultCompleted, nil
			resp, herr = in.recorded, nil // what was stored is what is sent
		}
	case s.cfg.Final(herr):
		out, oerr := outcome(resp, herr, in.metadata)
		if oerr != nil {
			_ = a.Release()
			ev.Result, ev.Err = request.ResultReleased, oerr
			return nil, status.Errorf(codes.Internal, "idempotency: %v", oerr)
		}
		ev.Result, err = request.ResultCompleted, a.Complete(out)
	default:
		ev.Result, err = request.ResultReleased, a.Release()
	}
	switch {
	case errors.Is(err, idemq.ErrLeaseLost) && (ev.Result == request.ResultCompleted || in.recorded != nil):
		// Taken over while the handler ran: the successor's outcome
		// stands, and is the answer if it is there yet.
		ev.Result, ev.Err = request.ResultFenced, err
		if rec, gerr := s.guard.Get(context.WithoutCancel(ctx), in.id()); gerr == nil && rec.State == request.Completed {
			return replay(ctx, rec, output)
		}
		return nil, rpcError(codes.Aborted, ReasonLeaseLost,
			"the call outlived its lease and a retry took the key over; retry to get the outcome that stands", retryInfo(time.Second))
	case err != nil && !errors.Is(err, idemq.ErrLeaseLost):
		// The work is done; the client gets its outcome even though the
		// record failed. A retry after the lease may run the handler again.
		ev.Result, ev.Err = request.ResultStoreFailed, err
	case ev.Result == request.ResultCompleted:
		s.expires(ctx, time.Now().Add(s.guard.Store().RecordTTL()))
	}
	return resp, herr
}

// expires advertises until when the outcome is kept.
func (s *server) expires(ctx context.Context, at time.Time) {
	_ = grpcgo.SetTrailer(ctx, metadata.Pairs(ExpiresTrailer, at.UTC().Format(time.RFC3339)))
}

// outcome encodes what the handler returned for the store: the status code
// (0 for OK), the marshalled response or google.rpc.Status, and the
// metadata the handler set.
func outcome(resp any, herr error, md *metadataCapture) (request.Response, error) {
	var m proto.Message
	code := codes.OK
	if herr != nil {
		st := status.Convert(herr)
		code, m = st.Code(), st.Proto()
	} else if m, _ = resp.(proto.Message); m == nil {
		return request.Response{}, fmt.Errorf("response %T is not a protobuf message", resp)
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return request.Response{}, fmt.Errorf("marshal response: %w", err)
	}
	return request.Response{Status: int(code), Header: md.stored(), Body: body}, nil
}

// replay answers with a completed record's outcome, marked as a replay.
func replay(ctx context.Context, rec request.Record, output protoreflect.MessageType) (any, error) {
	_ = grpcgo.SetTrailer(ctx, metadata.Pairs(ReplayedTrailer, "true",
		ExpiresTrailer, rec.ExpiresAt.UTC().Format(time.RFC3339)))
	stored := rec.Response
	replayMetadata(ctx, stored.Header)
	if stored.Omitted > 0 {
		return nil, rpcError(codes.FailedPrecondition, ReasonResponseNotKept, fmt.Sprintf(
			"the call with this key ran and ended %s, but its response of %d bytes was too large to keep; do not retry it, read the result another way",
			codes.Code(stored.Status), stored.Omitted))
	}
	if stored.Status != int(codes.OK) {
		st := new(statusProto)
		if err := proto.Unmarshal(stored.Body, st); err != nil {
			return nil, status.Errorf(codes.Internal, "idempotency: stored status: %v", err)
		}
		return nil, status.ErrorProto(st)
	}
	m := output.New().Interface()
	if err := proto.Unmarshal(stored.Body, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idempotency: stored response: %v", err)
	}
	return m, nil
}

// beginError maps Guard.Begin's errors to results and statuses.
func beginError(ctx context.Context, err error) (request.Result, error) {
	var conflict *request.ConflictError
	var inFlight *request.InFlightError
	switch {
	case errors.Is(err, request.ErrMisconfigured):
		return request.ResultMisconfigured, rpcError(codes.Internal, ReasonMisconfigured,
			"the server could not protect this call because of its own configuration; the call was not run and the operator's log says why")
	case errors.Is(err, request.ErrInvalidKey):
		return request.ResultRejected, rpcError(codes.InvalidArgument, ReasonKeyInvalid, strings.TrimPrefix(err.Error(), "request: "))
	case errors.As(err, &conflict):
		return request.ResultConflict, rpcError(codes.FailedPrecondition, ReasonKeyReused,
			"the key was first used for a different request; send a new key with a new request")
	case errors.As(err, &inFlight):
		wait := inFlight.RetryAfter()
		_ = grpcgo.SetTrailer(ctx, metadata.Pairs(PushbackTrailer, strconv.FormatInt(wait.Milliseconds(), 10)))
		return request.ResultInFlight, rpcError(codes.Aborted, ReasonInFlight,
			"a call with this key is in progress; retry with the same key", retryInfo(wait))
	case errors.Is(err, request.ErrUnavailable):
		return request.ResultUnavailable, rpcError(codes.Unavailable, ReasonStoreUnavailable,
			"the key store is unavailable; retry later with the same key", retryInfo(time.Second))
	}
	return request.ResultRejected, status.Errorf(codes.Internal, "idempotency: %v", err)
}

// keyOf reads the call's key from metadata or the request's field.
func keyOf(ctx context.Context, req any) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	keys := append(md.Get(MetadataKey), md.Get(MetadataKeyAlt)...)
	if f, ok := req.(interface{ GetIdempotencyKey() string }); ok && f.GetIdempotencyKey() != "" {
		keys = append(keys, f.GetIdempotencyKey())
	}
	if len(keys) == 0 {
		return "", nil
	}
	if slices.ContainsFunc(keys, func(k string) bool { return k != keys[0] }) {
		return "", errors.New("the call carries different keys (metadata " + MetadataKey + ", " + MetadataKeyAlt + ", field idempotency_key)")
	}
	return keys[0], nil
}
