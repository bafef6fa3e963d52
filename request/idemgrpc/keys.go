package idemgrpc

import (
	"context"
	"strconv"
	"sync"

	"github.com/google/uuid"
	"github.com/idemq/idemq/request"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Metadata names. gRPC metadata keys are lower case.
const (
	// MetadataKey carries the idempotency key of a call.
	MetadataKey = "idempotency-key"
	// MetadataKeyAlt is also accepted by the server, for clients that
	// follow the older X- convention.
	MetadataKeyAlt = "x-idempotency-key"
	// ReplayedTrailer is set to "true" in the trailer of a response that
	// was replayed from the record of an earlier call.
	ReplayedTrailer = "idempotent-replayed"
	// PushbackTrailer is gRPC's server pushback (gRFC A6): the number of
	// milliseconds a client should wait before retrying. The server sets
	// it on ABORTED while the first call is still running; grpc-go's own
	// retries and [UnaryClientInterceptor] honour it.
	PushbackTrailer = "grpc-retry-pushback-ms"
	// ExpiresTrailer is set on stored and replayed outcomes to the time
	// (RFC 3339, UTC) until which the key is kept at least: a retry before
	// then gets this outcome, one after may run the call again.
	ExpiresTrailer = "idempotency-key-expires"
)

// inbound is what the server interceptor knows about the call being
// handled, kept in its context so that downstream calls made by the handler
// derive their keys from it.
type inbound struct {
	scope, key string
	// attempt is set while a protected method's handler runs.
	attempt *request.Attempt
	// metadata records what the handler sends, for replays.
	metadata *metadataCapture
	// recorded is the response the handler stored with Record, and
	// recordedOK whether that succeeded.
	recorded   proto.Message
	recordedOK bool

	mu    sync.Mutex
	calls map[string]int // downstream calls started so far, by method
}

type inboundCtxKey struct{}

func (in *inbound) id() request.ID { return request.ID{Scope: in.scope, Key: in.key} }

func withInbound(ctx context.Context, in *inbound) context.Context {
	return context.WithValue(ctx, inboundCtxKey{}, in)
}

// KeyFromContext returns the idempotency key of the call a handler is
// serving, as the server interceptor read it (from metadata or from the
// request's idempotency_key field).
func KeyFromContext(ctx context.Context) (string, bool) {
	in, ok := ctx.Value(inboundCtxKey{}).(*inbound)
	if !ok {
		return "", false
	}
	return in.key, true
}

// keyNamespace makes derived keys name-based UUIDs of their own kind: the
// same inputs always give the same key, and no other UUIDv5 user collides
// with them.
var keyNamespace = uuid.MustParse("6b1d2a5e-7c53-4f7a-9a0e-4d1c8f3e2b90")

// downstreamKey returns the key of the next call to method made while
// serving in. The n-th call to one method gets the n-th key, so a retry of
// the incoming call that repeats its downstream calls in order sends each
// of them with the key it had the first time, and two calls never share a
// key. The caller's scope (its principal) is part of the name, so two
// clients that chose the same key derive different downstream keys.
func (in *inbound) downstreamKey(method string) string {
	in.mu.Lock()
	n := in.calls[method]
	if in.calls == nil {
		in.calls = make(map[string]int)
	}
	in.calls[method] = n + 1
	in.mu.Unlock()
	name := make([]byte, 0, len(in.scope)+len(in.key)+len(method)+8)
	for _, part := range []string{in.scope, in.key, method} {
		name = strconv.AppendQuote(name, part)
	}
	name = strconv.AppendInt(name, int64(n), 10)
	return uuid.NewSHA1(keyNamespace, name).String()
}

// outgoingKey returns the key already set on ctx's outgoing metadata.
func outgoingKey(ctx context.Context) (string, bool) {
	md, _ := metadata.FromOutgoingContext(ctx)
	for _, name := range []string{MetadataKey, MetadataKeyAlt} {
		if v := md.Get(name); len(v) > 0 {
			return v[0], true
		}
	}
	return "", false
}
