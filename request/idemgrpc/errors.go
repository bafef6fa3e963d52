package idemgrpc

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// statusProto is the google.rpc.Status a stored error is kept as.
type statusProto = spb.Status

// rpcError returns a status error with an ErrorInfo detail of reason and
// any further details.
func rpcError(code codes.Code, reason, msg string, details ...protoadapt.MessageV1) error {
	st := status.New(code, "idempotency: "+msg)
	details = append([]protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}, details...)
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// retryInfo tells a client how long to wait before it retries.
func retryInfo(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}
