// Package idemgrpc puts idemq's request idempotency on google.golang.org/grpc:
// a unary server interceptor that runs each call at most once per
// idempotency key, on a request.Store (Postgres, Redis or DynamoDB), and a
// unary client interceptor that gives each logical call one key for all of
// its attempts.
//
// # Server
//
// [UnaryServerInterceptor] protects the methods listed in
// [ServerConfig.Methods]. The key comes from the metadata [MetadataKey]
// ("idempotency-key", or [MetadataKeyAlt]) or from the request's
// idempotency_key field (a GetIdempotencyKey() string accessor, as in
// AEP-155), and is scoped by [ServerConfig.Scope] (the tenant or principal)
// so that one client's key can never replay another client's response. The
// request's fingerprint ([FingerprintDefault]: the method and the
// deterministic protobuf encoding) tells apart two requests sent with one
// key. Then:
//
//   - no key: INVALID_ARGUMENT ([ReasonKeyMissing]); a malformed or
//     over-long key (255 bytes by default; UUID or ULID form optional, see
//     request.KeyRules), or metadata and field that disagree:
//     INVALID_ARGUMENT ([ReasonKeyInvalid]);
//   - the key was used for another request: FAILED_PRECONDITION
//     ([ReasonKeyReused]), and the handler does not run. The client must
//     not retry the call as it is: it reused a key for a new request;
//   - the first call with the key is still running: ABORTED
//     ([ReasonInFlight]) with server pushback ([PushbackTrailer]) and a
//     RetryInfo, or, with ServerConfig.Guard.Wait, the answer once it
//     finishes. Not UNAVAILABLE, which retry policies repeat at once;
//   - the key has a stored outcome: that outcome (the response message,
//     or the error's status with its details, and the header and trailer
//     metadata the handler set) with the trailer
//     [ReplayedTrailer] "idempotent-replayed: true"; if the response was
//     too large for the store to keep, FAILED_PRECONDITION
//     ([ReasonResponseNotKept]): the outcome stands, do not retry;
//   - the key store cannot be reached: UNAVAILABLE
//     ([ReasonStoreUnavailable]); the handler never runs unprotected;
//   - [ServerConfig.Scope] or [ServerConfig.Fingerprint] returned what the
//     store cannot take: INTERNAL ([ReasonMisconfigured]) with the reason
//     in [ServerConfig.Logger];
//   - otherwise the handler runs under a lease that is renewed while it
//     runs, and its outcome is stored if [ServerConfig.Final] says so. By
//     default ([FinalDefault]) successes and final errors are stored, while
//     the [ReleaseCodes] (UNAVAILABLE, RESOURCE_EXHAUSTED,
//     DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNKNOWN, CANCELLED) and panics
//     release the key so that a retry runs the handler again.
//
// Each of the interceptor's own errors carries a google.rpc.ErrorInfo with
// [ErrorDomain] and one of the Reason constants. [ServerHooks.OnResult]
// reports what happened to every call, with the result names of the HTTP
// middleware.
//
// # Expiry and crashes
//
// An outcome is kept at least the store's record TTL (24 hours by default)
// and is replayed until then; stored and replayed outcomes carry the
// trailer [ExpiresTrailer] with that time. A process that dies while running
// a call holds its key for at most one lease (5 seconds by default), never
// for the record TTL: the next call takes the key over, and the late
// holder's outcome is refused by the lease's fencing token; its client gets
// the successor's outcome.
//
// # One transaction
//
// When the handler's effects are all in Postgres, let the front end own
// the transaction ([ServerConfig.OwnTransaction], on pgstore): it begins it with
// the key's claim in one round trip, the handler writes in it
// (pgstore.Tx(ctx)), and the outcome is stored in it with the one
// COMMIT. The writes and the record commit together or not at all; a
// duplicate waits for the first one's transaction and gets its outcome.
// Effects outside Postgres need the default leased mode. There, a handler
// can still commit its own writes and the request record together with
// [Record] and pgstore.Store.CompleteTx: if the lease was taken over
// meanwhile, the record is refused and the handler's transaction rolls
// back, so a stale attempt's writes never land.
//
// # Client
//
// [UnaryClientInterceptor] puts one key on every call: the caller's own
// (set in the outgoing metadata), or one derived from the call being served
// (see below), or a fresh UUIDv7. All attempts of the call carry it:
// the interceptor's own retries, grpc-go's retryPolicy (which replays the
// call below the interceptors) and a mesh's retries (which replay the same
// request). go-grpc-middleware's retry interceptor, by contrast, runs the
// rest of the chain once per attempt: place this interceptor before it, or
// every attempt gets a key of its own.
//
// The interceptor retries [ClientConfig.RetryCodes] itself, honouring
// server pushback, within [ClientConfig.Retry] and a [RetryBudget]: retries
// may add at most RetryRatio of the calls of the last Window, plus a small
// floor, so that a dependency that fails every call is not buried under
// retries. A budget also works with go-grpc-middleware's retry
// ([RetryBudget.Retriable]).
//
// A handler behind [UnaryServerInterceptor] that calls other services with
// its context gets, for each downstream call, a key derived from its
// caller's scope and key, the downstream method and the number of earlier
// calls to that method: distinct for every downstream call, and the same
// again when a retry of the incoming call repeats them in order, so the
// downstream services deduplicate too.
//
// # Deployment
//
// examples/grpc-orders runs a CreateOrder service through a network that
// loses replies, and its README shows the Linkerd configuration: the
// retry.linkerd.io annotations of Linkerd 2.16 and later, and a
// ServiceProfile with isRetryable and a retryBudget.
package idemgrpc
