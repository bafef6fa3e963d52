package idemgrpc

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// TestBadInputStreamingMethods: a streaming method in Methods is refused
// by the constructor with an error naming it, since a unary interceptor
// never sees its calls and it would run unprotected.
func TestBadInputStreamingMethods(t *testing.T) {
	t.Parallel()
	st := requesttest.OpenPostgres(t)
	for _, m := range []string{
		testgrpc.TestService_StreamingInputCall_FullMethodName,  // client streaming
		testgrpc.TestService_StreamingOutputCall_FullMethodName, // server streaming
		testgrpc.TestService_FullDuplexCall_FullMethodName,      // both
	} {
		_, err := UnaryServerInterceptor(st, ServerConfig{Methods: []string{testpb.Ledger_Charge_FullMethodName, m}})
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Methods" || !strings.Contains(err.Error(), m) || !strings.Contains(err.Error(), "streaming") {
			t.Errorf("Methods with %s: err = %v, want a ConfigError naming it as streaming", m, err)
		}
	}
	if _, err := UnaryServerInterceptor(st, ServerConfig{Methods: []string{testgrpc.TestService_UnaryCall_FullMethodName}}); err != nil {
		t.Fatalf("a unary method of the same service: %v", err)
	}
}

// TestBadInputTypedNilStore: a typed-nil store is an idemq.ErrConfig
// error, not a panic on every call.
func TestBadInputTypedNilStore(t *testing.T) {
	if _, err := UnaryServerInterceptor((*pgstore.Store)(nil), ServerConfig{Methods: chargeMethods}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("(*pgstore.Store)(nil): %v, want ErrConfig", err)
	}
}

// lockedBuffer is a log destination the server's goroutines write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestBadInputServerMisconfigured: a scope that is not printable ASCII or
// is over 128 bytes, and a fingerprint of 65 bytes, are the server's
// fault: INTERNAL with reason IDEMPOTENCY_SERVER_MISCONFIGURED and the
// reason logged, not INVALID_ARGUMENT or UNAVAILABLE; the handler does
// not run. A fingerprint that is too long for every request is refused by
// the constructor.
func TestBadInputServerMisconfigured(t *testing.T) {
	t.Parallel()
	st := requesttest.OpenPostgres(t)
	var logs lockedBuffer
	h := &counter{}
	scope := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if tenant := strings.Join(md.Get("tenant"), ""); tenant != "unicode" {
			return tenant, nil
		}
		return "tenant-ü", nil // a display name where an id belongs
	}
	fingerprint := func(ctx context.Context, method string, req proto.Message) ([]byte, error) {
		if req.(*testpb.ChargeRequest).Amount == 65 {
			return make([]byte, 65), nil
		}
		return FingerprintDefault(ctx, method, req)
	}
	c := dial(t, serve(t, &ledger{charge: h.charge}, grpcgo.UnaryInterceptor(serverInterceptor(t, st, request.Config{},
		ServerConfig{Scope: scope, Fingerprint: fingerprint, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))))
	for name, tc := range map[string]struct {
		tenant string
		amount int64
		logged string
	}{
		"non-ASCII scope": {"unicode", 1, "not printable ASCII"},
		"long scope":      {strings.Repeat("t", 129), 1, "over the limit of 128"},
		"65-byte digest":  {"t1", 65, "returned 65 bytes"},
	} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "tenant", tc.tenant)
		_, _, err := call(ctx, c, "k-"+name, &testpb.ChargeRequest{Amount: tc.amount})
		if code := reason(err); code != ReasonMisconfigured || !strings.Contains(logs.String(), tc.logged) {
			t.Errorf("%s: %v; log:\n%s", name, err, logs.String())
		}
		wantError(t, err, codes.Internal, ReasonMisconfigured)
	}
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
	wide := func(context.Context, string, proto.Message) ([]byte, error) { return make([]byte, 65), nil }
	if _, err := UnaryServerInterceptor(st, ServerConfig{Methods: chargeMethods, Fingerprint: wide}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("a 65-byte Fingerprint: %v, want ErrConfig", err)
	}
}

// TestBadInputResponseTooLargeToKeep: a response over what the DynamoDB store
// keeps is sent, and a retry gets FAILED_PRECONDITION with reason
// IDEMPOTENCY_RESPONSE_NOT_KEPT (the outcome stands, its body is gone),
// never an empty message passed off as the original; the handler runs
// once.
func TestBadInputResponseTooLargeToKeep(t *testing.T) {
	t.Parallel()
	db, table := testenv.DynamoDB(t)
	st := requesttest.Dynamo(t, db, table)
	var runs atomic.Int64
	big := strings.Repeat("c", dynamostore.MaxResponse)
	charge := func(_ context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
		runs.Add(1)
		return &testpb.ChargeResponse{ChargeId: big, Amount: req.Amount}, nil
	}
	c := dial(t, serve(t, &ledger{charge: charge}, grpcgo.UnaryInterceptor(serverInterceptor(t, st, request.Config{}, ServerConfig{}))))
	resp, _, err := call(t.Context(), c, "big-1", &testpb.ChargeRequest{Amount: 1})
	if err != nil || resp.ChargeId != big {
		t.Fatalf("first call: %v", err)
	}
	_, _, err = call(t.Context(), c, "big-1", &testpb.ChargeRequest{Amount: 1})
	wantError(t, err, codes.FailedPrecondition, ReasonResponseNotKept)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
}
