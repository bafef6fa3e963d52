package idemgrpc

import (
	"context"
	"errors"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"google.golang.org/protobuf/proto"
)

// ErrNotProtected is returned by [Record] outside the handler of a
// protected method, and in the transaction-owning mode
// (ServerConfig.OwnTransaction), where the interceptor stores the outcome
// in the call's transaction itself.
var ErrNotProtected = errors.New("grpc: the call is not protected by the idempotency interceptor")

// ErrRecorded is returned by a second [Record] in one call.
var ErrRecorded = errors.New("grpc: the call's outcome was already recorded")

// Record stores resp as the outcome of the call being handled through
// complete, and returns complete's error. Use it to commit the request
// record in the handler's own transaction, so that "applied" and
// "recorded" cannot diverge:
//
//	resp := &orderspb.Order{...}
//	err := idemgrpc.Record(ctx, resp, func(l idemq.Lease, r request.Response) error {
//		return store.CompleteTx(ctx, tx, l, r) // pgstore.Store
//	})
//	// then tx.Commit(ctx) and return resp
//
// If complete returns idemq.ErrLeaseLost, another attempt took the key
// over: roll back. Once Record was called the interceptor stores nothing
// itself: when the handler returns it hands the key back if the
// transaction rolled back after all (or Record failed), and otherwise
// sends resp, whatever the handler returned, since the sent and the
// stored outcome must be the same.
func Record(ctx context.Context, resp proto.Message, complete func(idemq.Lease, request.Response) error) error {
	in, ok := ctx.Value(inboundCtxKey{}).(*inbound)
	if !ok || in.attempt == nil {
		return ErrNotProtected
	}
	if in.recorded != nil {
		return ErrRecorded
	}
	in.recorded = resp
	out, err := outcome(resp, nil, in.metadata)
	if err != nil {
		return err
	}
	err = in.attempt.CompleteWith(func(l idemq.Lease) error { return complete(l, out) })
	in.recordedOK = err == nil
	return err
}

// LeaseFromContext returns the lease under which the handler of a
// protected method runs, for a handler that passes the fencing token
// downstream so that the far side can refuse a stale writer too.
func LeaseFromContext(ctx context.Context) (idemq.Lease, bool) {
	in, ok := ctx.Value(inboundCtxKey{}).(*inbound)
	if !ok || in.attempt == nil {
		return idemq.Lease{}, false
	}
	return in.attempt.Lease(), true
}
