package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/requesttest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// eachStore runs test as a parallel subtest per store kind.
func eachStore(t *testing.T, test func(t *testing.T, open func(testing.TB) request.Store)) {
	for _, kind := range requesttest.Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			t.Parallel()
			test(t, kind.Open)
		})
	}
}

var chargeMethods = []string{testpb.Ledger_Charge_FullMethodName}

// serverInterceptor protects cfg.Methods (Charge by default) on st.
func serverInterceptor(tb testing.TB, st request.Store, gcfg request.Config, cfg ServerConfig) grpcgo.UnaryServerInterceptor {
	tb.Helper()
	if cfg.Methods == nil {
		cfg.Methods = chargeMethods
	}
	cfg.Guard = gcfg
	ic, err := UnaryServerInterceptor(st, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return ic
}

// counter is a Charge handler that counts its runs, numbers its charges
// and returns the first outcomes given, then successes.
type counter struct {
	name     string // prefixes the charge ids
	runs     atomic.Int64
	outcomes []func(ctx context.Context) error // by run, 1-based; nil: succeed
}

func (c *counter) charge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
	run := c.runs.Add(1)
	if int(run) <= len(c.outcomes) && c.outcomes[run-1] != nil {
		if err := c.outcomes[run-1](ctx); err != nil {
			return nil, err
		}
	}
	return &testpb.ChargeResponse{ChargeId: fmt.Sprintf("%sch-%d", c.name, run), Amount: req.Amount}, nil
}

func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
}

// reason returns the ErrorInfo reason of err's status.
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

func wantError(tb testing.TB, err error, code codes.Code, why string) {
	tb.Helper()
	if status.Code(err) != code || reason(err) != why {
		tb.Fatalf("err = %v (reason %q), want %v %s", err, reason(err), code, why)
	}
}

// call charges with key and returns the response, the error and whether
// the response was marked as a replay. A call that gets no answer within
// requesttest.WaitTimeout fails with DeadlineExceeded instead of hanging
// the test.
func call(ctx context.Context, c testpb.LedgerClient, key string, req *testpb.ChargeRequest) (*testpb.ChargeResponse, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, requesttest.WaitTimeout)
	defer cancel()
	var trailer metadata.MD
	resp, err := c.Charge(withKey(ctx, key), req, grpcgo.Trailer(&trailer))
	return resp, strings.Join(trailer.Get(ReplayedTrailer), ",") == "true", err
}

func TestConcurrentIdenticalCallsRunOnce(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(testing.TB) request.Store) {
		const callers = 50
		// answered counts the callers answered while the first ran: once
		// all of them were, whatever their answer, the first may finish.
		var aborted, answered atomic.Int64
		othersDone := make(chan struct{})
		h := &counter{outcomes: []func(context.Context) error{func(ctx context.Context) error {
			select { // hold the key until every other caller was answered
			case <-othersDone:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}}
		logStoreErrors := ServerHooks{OnResult: func(ev ResultEvent) {
			if ev.Result == request.ResultUnavailable || ev.Result == request.ResultStoreFailed {
				t.Logf("%s: %v", ev.Result, ev.Err)
			}
		}}
		// 50 calls at once on a loaded machine can keep a store (dynalite
		// in particular) busy past the default timeout; this test is about
		// concurrency, not latency.
		patient := request.Config{StoreTimeout: 30 * time.Second}
		addr := serve(t, &ledger{charge: h.charge},
			grpcgo.UnaryInterceptor(serverInterceptor(t, open(t), patient, ServerConfig{Hooks: logStoreErrors})))
		c := dial(t, addr)
		req := &testpb.ChargeRequest{Account: "acct-1", Amount: 250}

		var wg sync.WaitGroup
		responses := make(chan *testpb.ChargeResponse, callers)
		for range callers {
			wg.Go(func() {
				resp, replayed, err := call(t.Context(), c, "order-1", req)
				if (err != nil || replayed) && answered.Add(1) == callers-1 {
					close(othersDone)
				}
				switch {
				case status.Code(err) == codes.Aborted && reason(err) == ReasonInFlight:
					aborted.Add(1)
				case err != nil:
					t.Errorf("call: %v", err)
				case replayed:
					t.Errorf("a replay while the first call was still running: %v", resp)
				default:
					responses <- resp
				}
			})
		}
		wg.Wait()
		close(responses)
		first := <-responses
		if h.runs.Load() != 1 || first == nil || aborted.Load() != callers-1 {
			t.Fatalf("handler ran %d times, %d callers ABORTED, first response %v", h.runs.Load(), aborted.Load(), first)
		}

		for range callers { // after completion, every retry gets the same response
			wg.Go(func() {
				resp, replayed, err := call(t.Context(), c, "order-1", req)
				if err != nil || !replayed || !proto.Equal(resp, first) {
					t.Errorf("retry = %v, replayed %v, %v; want %v replayed", resp, replayed, err, first)
				}
			})
		}
		wg.Wait()
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times", h.runs.Load())
		}
	})
}

func TestReusedKeyWithAnotherRequest(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(testing.TB) request.Store) {
		h := &counter{}
		c := dial(t, serve(t, &ledger{charge: h.charge},
			grpcgo.UnaryInterceptor(serverInterceptor(t, open(t), request.Config{}, ServerConfig{}))))
		if _, _, err := call(t.Context(), c, "k", &testpb.ChargeRequest{Account: "a", Amount: 1}); err != nil {
			t.Fatal(err)
		}
		_, _, err := call(t.Context(), c, "k", &testpb.ChargeRequest{Account: "a", Amount: 2})
		wantError(t, err, codes.FailedPrecondition, ReasonKeyReused)
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times", h.runs.Load())
		}
	})
}

func TestMissingOrMalformedKey(t *testing.T) {
	t.Parallel()
	h := &counter{}
	ic := serverInterceptor(t, requesttest.OpenPostgres(t), request.Config{Keys: request.KeyRules{Format: request.UUIDKey}}, ServerConfig{})
	c := dial(t, serve(t, &ledger{charge: h.charge}, grpcgo.UnaryInterceptor(ic)))
	ctx := t.Context()
	uuidKey := "0190b4a2-7f5e-7c1a-9d2b-3e4f5a6b7c8d"
	for name, tc := range map[string]struct {
		ctx    context.Context
		req    *testpb.ChargeRequest
		reason string
	}{
		"no key":             {ctx, &testpb.ChargeRequest{}, ReasonKeyMissing},
		"not a UUID":         {withKey(ctx, "order-1"), &testpb.ChargeRequest{}, ReasonKeyInvalid},
		"too long":           {withKey(ctx, strings.Repeat("a", 256)), &testpb.ChargeRequest{}, ReasonKeyInvalid},
		"control characters": {ctx, &testpb.ChargeRequest{IdempotencyKey: "a\nb"}, ReasonKeyInvalid},
		"metadata and field disagree": {withKey(ctx, uuidKey),
			&testpb.ChargeRequest{IdempotencyKey: "0190b4a2-7f5e-7c1a-9d2b-3e4f5a6b7c8e"}, ReasonKeyInvalid},
		"two metadata keys disagree": {metadata.AppendToOutgoingContext(withKey(ctx, uuidKey), MetadataKeyAlt, "x"),
			&testpb.ChargeRequest{}, ReasonKeyInvalid},
	} {
		_, err := c.Charge(tc.ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || reason(err) != tc.reason {
			t.Errorf("%s: err = %v (reason %q), want INVALID_ARGUMENT %s", name, err, reason(err), tc.reason)
		}
	}
	if h.runs.Load() != 0 {
		t.Fatalf("handler ran %d times on bad keys", h.runs.Load())
	}
	// The key is accepted from either metadata name or from the field.
	for i, keyed := range []func(key string) (context.Context, *testpb.ChargeRequest){
		func(key string) (context.Context, *testpb.ChargeRequest) {
			return withKey(ctx, key), &testpb.ChargeRequest{}
		},
		func(key string) (context.Context, *testpb.ChargeRequest) {
			return metadata.AppendToOutgoingContext(ctx, MetadataKeyAlt, key), &testpb.ChargeRequest{}
		},
		func(key string) (context.Context, *testpb.ChargeRequest) {
			return ctx, &testpb.ChargeRequest{IdempotencyKey: key}
		},
	} {
		resp, err := c.Charge(keyed(uuid.NewString()))
		if err != nil || resp.ChargeId != fmt.Sprintf("ch-%d", i+1) {
			t.Fatalf("call %d: %v, %v", i, resp, err)
		}
	}
}

// Transient errors and panics release the key: the retry runs the handler
// and its outcome is the one stored. Final errors are stored and replayed.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(testing.TB) request.Store) {
		st := open(t)
		for name, tc := range map[string]struct {
			first    func(context.Context) error
			released bool
		}{
			"unavailable": {func(context.Context) error { return status.Error(codes.Unavailable, "busy") }, true},
			"resource exhausted": {func(context.Context) error {
				return status.Error(codes.ResourceExhausted, "quota")
			}, true},
			"deadline exceeded": {func(context.Context) error { return status.Error(codes.DeadlineExceeded, "slow") }, true},
			"plain error":       {func(context.Context) error { return errors.New("database hiccup") }, true},
			"panic":             {func(context.Context) error { panic("handler bug") }, true},
			"not found":         {func(context.Context) error { return status.Error(codes.NotFound, "no account") }, false},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				h := &counter{outcomes: []func(context.Context) error{tc.first}}
				results := make(chan request.Result, 3)
				report := ServerConfig{Hooks: ServerHooks{OnResult: func(ev ResultEvent) { results <- ev.Result }}}
				c := dial(t, serve(t, &ledger{charge: h.charge}, grpcgo.ChainUnaryInterceptor(
					recovery.UnaryServerInterceptor(), serverInterceptor(t, st, request.Config{}, report))))
				req := &testpb.ChargeRequest{Account: "a", Amount: 7}
				_, _, first := call(t.Context(), c, name, req)
				if first == nil {
					t.Fatal("first call succeeded")
				}
				if got, want := requesttest.Recv(t, results, "the first call's result"), map[bool]request.Result{true: request.ResultReleased, false: request.ResultCompleted}[tc.released]; got != want {
					t.Fatalf("first call's result %v, want %v", got, want)
				}
				resp, replayed, err := call(t.Context(), c, name, req)
				switch {
				case tc.released && (err != nil || replayed || resp.ChargeId != "ch-2"):
					t.Fatalf("retry = %v, replayed %v, %v; want the handler's second run", resp, replayed, err)
				case !tc.released && (!replayed || status.Code(err) != status.Code(first) || status.Convert(err).Message() != status.Convert(first).Message()):
					t.Fatalf("retry = %v, replayed %v; want %v replayed", err, replayed, first)
				}
				again, replayed, err := call(t.Context(), c, name, req)
				if !replayed || (tc.released && (err != nil || !proto.Equal(again, resp))) || (!tc.released && status.Code(err) != status.Code(first)) {
					t.Fatalf("third call = %v, replayed %v, %v; want the stored outcome replayed", again, replayed, err)
				}
				if want := map[bool]int64{true: 2, false: 1}[tc.released]; h.runs.Load() != want {
					t.Fatalf("handler ran %d times, want %d", h.runs.Load(), want)
				}
			})
		}
	})
}

// A mesh that loses the first response and retries the same request gets
// the original response back, and one charge is made.
func TestRetryingMeshLosesFirstResponse(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(testing.TB) request.Store) {
		h := &counter{}
		backend := serve(t, &ledger{charge: h.charge},
			grpcgo.UnaryInterceptor(serverInterceptor(t, open(t), request.Config{}, ServerConfig{})))
		mesh := &meshProxy{drop: 1}
		c := dial(t, serveMesh(t, backend, mesh),
			grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{Retry: idemq.Retry{MaxAttempts: 1}})))

		var trailer metadata.MD
		resp, err := c.Charge(t.Context(), &testpb.ChargeRequest{Account: "a", Amount: 99}, grpcgo.Trailer(&trailer))
		if err != nil {
			t.Fatal(err)
		}
		original := new(testpb.ChargeResponse)
		if err := proto.Unmarshal(mesh.dropped[0], original); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp, original) || trailer.Get(ReplayedTrailer)[0] != "true" {
			t.Fatalf("client got %v (trailer %v), the lost original was %v", resp, trailer, original)
		}
		if h.runs.Load() != 1 || mesh.tries != 2 {
			t.Fatalf("handler ran %d times over %d tries", h.runs.Load(), mesh.tries)
		}
	})
}

// Calls of one key from two principals are two requests.
func TestScopePerPrincipal(t *testing.T) {
	t.Parallel()
	h := &counter{}
	tenant := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if t := md.Get("tenant"); len(t) == 1 {
			return t[0], nil
		}
		return "", status.Error(codes.Unauthenticated, "who are you?")
	}
	c := dial(t, serve(t, &ledger{charge: h.charge},
		grpcgo.UnaryInterceptor(serverInterceptor(t, requesttest.OpenPostgres(t), request.Config{}, ServerConfig{Scope: tenant}))))
	for i, who := range []string{"alice", "bob"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", who)
		resp, replayed, err := call(ctx, c, "same-key", &testpb.ChargeRequest{Account: who, Amount: int64(i)})
		if err != nil || replayed || resp.ChargeId != fmt.Sprintf("ch-%d", i+1) {
			t.Fatalf("%s: %v, replayed %v, %v", who, resp, replayed, err)
		}
	}
	_, _, err := call(t.Context(), c, "same-key", &testpb.ChargeRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("anonymous call: %v", err)
	}
}

// Downstream calls get keys derived from the incoming one: distinct per
// call, and the same again when a retry repeats them.
func TestDownstreamKeys(t *testing.T) {
	t.Parallel()
	st := requesttest.OpenPostgres(t)
	charges := &counter{}
	var seen attempts
	downstream := serve(t, &ledger{charge: charges.charge},
		grpcgo.ChainUnaryInterceptor(seen.interceptor, serverInterceptor(t, st, request.Config{}, ServerConfig{})))
	ledgerClient := dial(t, downstream, grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{Retry: idemq.Retry{MaxAttempts: 1}})))

	var transfers atomic.Int64
	upstream := serve(t, &ledger{transfer: func(ctx context.Context, req *testpb.TransferRequest) (*testpb.TransferResponse, error) {
		debit, err := ledgerClient.Charge(ctx, &testpb.ChargeRequest{Account: req.From, Amount: -req.Amount})
		if err != nil {
			return nil, err
		}
		credit, err := ledgerClient.Charge(ctx, &testpb.ChargeRequest{Account: req.To, Amount: req.Amount})
		if err != nil {
			return nil, err
		}
		if transfers.Add(1) == 1 { // the first run fails after its charges, releasing the key
			return nil, status.Error(codes.Unavailable, "lost the reply")
		}
		return &testpb.TransferResponse{DebitId: debit.ChargeId, CreditId: credit.ChargeId}, nil
	}}, grpcgo.UnaryInterceptor(serverInterceptor(t, st, request.Config{}, ServerConfig{Methods: []string{testpb.Ledger_Transfer_FullMethodName}})))
	c := dial(t, upstream, grpcgo.WithUnaryInterceptor(clientInterceptor(t, ClientConfig{Retry: fastRetry})))

	resp, err := c.Transfer(t.Context(), &testpb.TransferRequest{From: "a", To: "b", Amount: 10})
	if err != nil {
		t.Fatal(err)
	}
	keys := seen.values(MetadataKey)
	if len(keys) != 4 || keys[0] == keys[1] || keys[0] != keys[2] || keys[1] != keys[3] {
		t.Fatalf("downstream keys %q: want two distinct keys, each sent again by the retry", keys)
	}
	if charges.runs.Load() != 2 || resp.DebitId != "ch-1" || resp.CreditId != "ch-2" {
		t.Fatalf("%d charges, transfer %v", charges.runs.Load(), resp)
	}
}

func TestServerConfigErrors(t *testing.T) {
	t.Parallel()
	st := requesttest.OpenPostgres(t)
	for name, cfg := range map[string]ServerConfig{
		"no methods":         {},
		"not a full method":  {Methods: []string{"Charge"}},
		"unknown method":     {Methods: []string{"/idemq.grpctest.v1.Ledger/Refund"}},
		"unregistered proto": {Methods: []string{"/nowhere.v1.Svc/Do"}},
	} {
		_, err := UnaryServerInterceptor(st, cfg)
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Methods" {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	for name, tc := range map[string]struct {
		st  request.Store
		cfg request.Config
	}{
		"Store": {nil, request.Config{}},
		"Lease": {st, request.Config{Lease: time.Millisecond}},
	} {
		_, err := UnaryServerInterceptor(tc.st, ServerConfig{Methods: chargeMethods, Guard: tc.cfg})
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != name {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// A replay carries the metadata the handler sent with the first outcome.
func TestReplayCarriesHandlerMetadata(t *testing.T) {
	t.Parallel()
	h := &counter{outcomes: []func(context.Context) error{func(ctx context.Context) error {
		if err := grpcgo.SetHeader(ctx, metadata.Pairs("location", "/charges/1")); err != nil {
			return err
		}
		return grpcgo.SetTrailer(ctx, metadata.Pairs("charge-version", "7"))
	}}}
	c := dial(t, serve(t, &ledger{charge: h.charge},
		grpcgo.UnaryInterceptor(serverInterceptor(t, requesttest.OpenPostgres(t), request.Config{}, ServerConfig{}))))
	for i := range 2 {
		var header, trailer metadata.MD
		_, err := c.Charge(withKey(t.Context(), "k"), &testpb.ChargeRequest{Amount: 1}, grpcgo.Header(&header), grpcgo.Trailer(&trailer))
		if err != nil {
			t.Fatal(err)
		}
		replayed := len(trailer.Get(ReplayedTrailer)) > 0
		if strings.Join(header.Get("location"), ",") != "/charges/1" || strings.Join(trailer.Get("charge-version"), ",") != "7" ||
			replayed != (i == 1) || len(trailer.Get(ExpiresTrailer)) != 1 {
			t.Fatalf("call %d: header %v, trailer %v", i, header, trailer)
		}
	}
	if h.runs.Load() != 1 {
		t.Fatalf("handler ran %d times", h.runs.Load())
	}
}

// TestClientGoneAfterFinalResponseIsStored: a client that goes away (its
// context cancelled) while the handler runs does not make the outcome the
// handler then returns a lost one: a final response, or a final error, is
// stored all the same, and the retry with the same key gets it replayed;
// the handler ran once.
func TestClientGoneAfterFinalResponseIsStored(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, open func(testing.TB) request.Store) {
		st := open(t)
		for name, final := range map[string]error{"response": nil, "final error": status.Error(codes.FailedPrecondition, "account closed")} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				started, clientGone := make(chan struct{}), make(chan error, 1)
				var runs atomic.Int64
				charge := func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
					runs.Add(1)
					close(started)
					select { // the work is done; the client leaves before the answer
					case <-ctx.Done():
						clientGone <- nil
					case <-time.After(20 * time.Second):
						clientGone <- errors.New("the handler's context was not cancelled when the client went away")
					}
					if final != nil {
						return nil, final
					}
					return &testpb.ChargeResponse{ChargeId: "ch-1", Amount: req.Amount}, nil
				}
				results := make(chan ResultEvent, 2)
				report := ServerConfig{Hooks: ServerHooks{OnResult: func(ev ResultEvent) { results <- ev }}}
				c := dial(t, serve(t, &ledger{charge: charge}, grpcgo.UnaryInterceptor(serverInterceptor(t, st, request.Config{}, report))))
				req := &testpb.ChargeRequest{Account: "a", Amount: 5}
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				key := "gone-" + strings.ReplaceAll(name, " ", "-")
				go func() { _, _, err := call(ctx, c, key, req); done <- err }()
				select {
				case <-started:
				case err := <-done:
					t.Fatalf("the first call ended before the handler ran: %v", err)
				case <-time.After(requesttest.WaitTimeout):
					t.Fatal("gave up waiting for the first call to reach the handler")
				}
				cancel()
				if err := requesttest.Recv(t, done, "the first call to end"); status.Code(err) != codes.Canceled {
					t.Fatalf("the client that went away got %v, want Canceled", err)
				}
				if err := requesttest.Recv(t, clientGone, "the handler to see its client leave"); err != nil {
					t.Fatal(err)
				}
				if ev := requesttest.Recv(t, results, "the first call's result"); ev.Result != request.ResultCompleted || ev.Err != nil {
					t.Fatalf("first call's result %v (%v), want %v: the outcome stored although the client left", ev.Result, ev.Err, request.ResultCompleted)
				}
				resp, replayed, err := call(t.Context(), c, key, req)
				switch {
				case !replayed:
					t.Fatalf("retry = %v, %v, not replayed: the handler ran again", resp, err)
				case final == nil && (err != nil || resp.ChargeId != "ch-1"):
					t.Fatalf("retry = %v, %v; want ch-1 replayed", resp, err)
				case final != nil && (status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "account closed"):
					t.Fatalf("retry = %v; want %v replayed", err, final)
				}
				if n := runs.Load(); n != 1 {
					t.Fatalf("the handler ran %d times, want once", n)
				}
			})
		}
	})
}
