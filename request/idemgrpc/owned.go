package idemgrpc

import (
	"context"
	"fmt"
	"time"

	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemq/idemq/request"
)

// serveTx runs a protected call in the transaction-owning mode
// (ServerConfig.OwnTransaction).
func (s *server) serveTx(ctx context.Context, req any, id request.ID, fp []byte, output protoreflect.MessageType,
	handler grpcgo.UnaryHandler, ev *ResultEvent, rejectBegin func(error) (any, error)) (any, error) {
	d, err := s.guard.BeginTx(ctx, id, fp)
	if err != nil {
		return rejectBegin(err)
	}
	if d.Replay != nil {
		ev.Result = request.ResultReplayed
		return replay(ctx, *d.Replay, output)
	}
	a := d.Run
	hctx, captured := captureMetadata(a.Context(ctx))
	defer func() {
		if v := recover(); v != nil {
			// Nothing the handler wrote stays; the panic goes on up.
			ev.Result, ev.Err = request.ResultReleased, fmt.Errorf("handler panicked: %v", v)
			_ = a.Rollback(ctx)
			panic(v)
		}
	}()
	resp, herr := handler(withInbound(hctx, &inbound{scope: id.Scope, key: id.Key, metadata: captured}), req)
	if !s.cfg.Final(herr) {
		ev.Result, ev.Err = request.ResultReleased, a.Rollback(ctx)
		return resp, herr
	}
	out, err := outcome(resp, herr, captured)
	if err == nil {
		err = a.Commit(ctx, out)
	} else {
		err = fmt.Errorf("%w (rolled back: %w)", err, a.Rollback(ctx))
	}
	if err != nil {
		ev.Result, ev.Err = request.ResultStoreFailed, err
		return nil, rpcError(codes.Unavailable, ReasonNotCommitted,
			"the call's transaction did not commit; retry with the same key: the retry gets this call's outcome if it committed after all, or runs it", retryInfo(time.Second))
	}
	ev.Result = request.ResultCompleted
	s.expires(ctx, time.Now().Add(s.guard.Store().RecordTTL()))
	return resp, herr
}
