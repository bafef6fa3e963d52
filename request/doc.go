// Package request runs API requests at most once per idempotency key: the
// leased request records behind the HTTP Idempotency-Key middleware
// (request/idemhttp) and the gRPC interceptor (request/idemgrpc).
//
// # Records, leases and fencing
//
// A [Store] keeps one [Record] per [ID] (a scope such as the tenant or
// principal, and the client's key). The first request claims the key under
// a short lease; the record itself lives much longer ([RecordTTLDefault],
// 24 hours), so the two never share a TTL: a process that crashes while
// holding a key blocks it for one lease, not for a day. When a lease runs
// out, the next request takes the key over with a larger fencing token, and
// the late holder's Complete is refused ([idemq.ErrLeaseLost]) so that its
// successor's response stands.
//
// # Guard
//
// A [Guard] is what front ends use: [Guard.Begin] checks the key against
// [KeyRules], claims it and decides: run the request ([Attempt]), replay
// the stored [Response], or report an [*InFlightError] (optionally after
// waiting), a [*ConflictError] (the key was used for another request, told
// apart by a [Fingerprint]) or an [ErrUnavailable] (fail closed: the store
// is down, so the request must not run). An attempt's lease is renewed
// while it runs; [Attempt.Complete] stores the response, [Attempt.Release]
// hands the key back after a failure that a retry may fix.
//
// # The transaction-owning mode
//
// When a request's effects are all in the store's database, a [TxStore]
// (pgstore) runs it in one transaction instead: [Guard.BeginTx] begins it
// with the key's claim, the handler writes in it, and [TxAttempt.Commit]
// stores the response and commits once. No lease is involved: a crash
// rolls the effects and the claim back together, and a duplicate waits for
// the transaction on the key, then replays its response.
//
// # Stores
//
// Three stores pass one conformance suite (package requesttest):
// request/pgstore (Postgres, durable, can complete inside the handler's
// own transaction or run the request in a transaction of its own), request/redisstore (fast, with the limits of Redis
// replication and eviction) and request/dynamostore (DynamoDB conditional
// writes).
package request
