package request

import "fmt"

// Result is what a front end (the HTTP middleware, the gRPC interceptor) did
// with one protected request; both report in these terms so that metrics
// and logs read alike.
type Result uint8

const (
	// ResultCompleted: the handler ran and its outcome was stored.
	ResultCompleted Result = iota + 1
	// ResultReleased: the handler ran, failed (5xx, a release code, a panic, a
	// timeout) and the key was handed back.
	ResultReleased
	// ResultReplayed: the stored outcome answered the request.
	ResultReplayed
	// ResultInFlight: another request held the key (HTTP 409, gRPC ABORTED).
	ResultInFlight
	// ResultConflict: the key was used for another request (HTTP 422, gRPC
	// FAILED_PRECONDITION).
	ResultConflict
	// ResultRejected: the key was missing or malformed, the body too large, or
	// the scope or fingerprint failed (HTTP 400/413, gRPC INVALID_ARGUMENT).
	ResultRejected
	// ResultUnavailable: the store failed before the handler ran (HTTP 503, gRPC
	// UNAVAILABLE).
	ResultUnavailable
	// ResultFenced: the handler ran but its lease was taken over meanwhile; the
	// successor's outcome stands.
	ResultFenced
	// ResultUnprotected: a request allowed to go without a key ran unprotected.
	ResultUnprotected
	// ResultStoreFailed: the handler ran but its outcome could not be stored;
	// the response was sent and the key will be free after its lease.
	ResultStoreFailed
	// ResultMisconfigured: the server's scope or fingerprint function gave
	// a value the store cannot take, or the store is set up wrong (HTTP
	// 500, gRPC INTERNAL); the handler did not run and the reason is
	// logged.
	ResultMisconfigured
)

func (r Result) String() string {
	names := [...]string{"", "completed", "released", "replayed", "in_flight", "conflict", "rejected",
		"unavailable", "fenced", "unprotected", "store_failed", "misconfigured"}
	if int(r) < len(names) && r > 0 {
		return names[r]
	}
	return fmt.Sprintf("Result(%d)", uint8(r))
}
