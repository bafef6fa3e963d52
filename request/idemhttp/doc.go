// Package idemhttp puts idemq on net/http: the Idempotency-Key middleware of
// draft-ietf-httpapi-idempotency-key-header-07 on a request.Store.
//
// # The middleware
//
// [New] returns a [Middleware]; its Wrap method is a
// func(http.Handler) http.Handler. For every protected request (POST and
// PATCH by default; see [Config.Protect] for per-route choices) it reads
// the Idempotency-Key header, an sf-string ("\"8e03978e-…\"") or, unless
// [Config.Strict], a bare key, and scopes it by [Config.Scope] (the tenant
// or principal). Then:
//
//   - no key: 400 ([ProblemKeyMissing]); a malformed or over-long key
//     (255 bytes by default; UUID or ULID form optional): 400
//     ([ProblemKeyMalformed]);
//   - the key was used for another request (method, route, query or
//     canonical body differ, see [FingerprintDefault]): 422
//     ([ProblemKeyReused]), and the handler does not run;
//   - the first request with the key is still running: 409 with
//     Retry-After ([ProblemInFlight]), or, with Config.Guard.Wait, the
//     answer once it finishes;
//   - the key has a stored response: that response (status, body and the
//     allow-listed headers of [ReplayHeadersDefault]) with
//     "Idempotent-Replayed: true"; if its body was too large to keep
//     ([Config.MaxResponse] or the store's limit), 410
//     ([ProblemResponseNotKept]) with the original status and Location,
//     never an empty body;
//   - the key store cannot be reached: 503 with Retry-After
//     ([ProblemUnavailable]); the handler never runs unprotected;
//   - [Config.Scope] or [Config.Fingerprint] returned what the store
//     cannot take: 500 ([ProblemMisconfigured]) with the reason in
//     [Config.Logger]; the client is not to blame;
//   - otherwise the handler runs under a lease that is renewed while it
//     runs. Its response is buffered, stored if [Config.Final] says so,
//     and only then sent; by default ([FinalDefault]) 2xx and 4xx (but
//     408, 409, 425 and 429) are stored, also when the client went away
//     meanwhile, while 5xx, 408/409/425/429, a panic, and a handler that
//     wrote nothing when its deadline passed or its client went away
//     release the key so that a retry runs the handler again.
//
// Error bodies are RFC 9457 application/problem+json documents whose type
// URI names one of the Problem constants: a section of problems.md in the
// repository, which tells the client what to do.
//
// # Expiry
//
// A key is kept at least the store's record TTL (24 hours by default)
// after its response was stored. Stored and replayed responses carry
// "Idempotency-Key-Expires" ([HeaderExpires]), the HTTP-date until which a
// retry gets the stored response; a request after that may run again. A
// process that dies while running a request holds its key for at most
// one lease (5 seconds by default), never for the record TTL.
//
// # One transaction
//
// When the handler's effects are all in Postgres, let the front end own
// the transaction ([Config.OwnTransaction], on pgstore): it begins it with
// the key's claim in one round trip, the handler writes in it
// (pgstore.Tx(r.Context())), and the response is stored in it with the one
// COMMIT. The writes and the record commit together or not at all; a
// duplicate waits for the first one's transaction and gets its response.
// Effects outside Postgres need the default leased mode. There, a handler
// can still commit its own writes and the request record together with
// [Record] and pgstore.Store.CompleteTx: if the lease was taken over
// meanwhile, the record is refused and the handler's transaction rolls
// back, so a stale attempt's writes never land.
package idemhttp
