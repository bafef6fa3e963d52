// Package inbox is the Postgres record of every message a consumer applied.
//
// A [Store] keeps one [Record] per (scope, key): the scope names the
// consumer (two consumers of one message each apply it once), the key is
// the message id or a business key. The record is written in one of two
// ways:
//
//   - Transactional: [Store.Claim] and [Store.ClaimBatch] insert the record
//     inside the caller's pgx.Tx, the same transaction that carries the
//     message's side effects ([Store.BeginClaim] begins that transaction
//     and claims in one round trip). The record exists if and only if those effects
//     committed, so a failed handler never marks a message as seen. Two
//     transactions claiming one key serialise on the primary key: the second
//     waits, then sees a duplicate if the first committed or claims the key
//     if it rolled back.
//
//   - Leased, for side effects outside Postgres: [Store.Acquire] marks the
//     record IN_PROGRESS for an owner until a deadline and hands out a
//     fencing token that grows with every claim and takeover. [Store.Complete]
//     and [Store.Fail] are compare-and-set on that token, so a worker
//     whose lease expired and was taken over can never overwrite the result
//     of its successor; pass the token downstream so the far side can reject
//     a stale writer too.
//
// A record carries a fingerprint of the payload: the same key with another
// fingerprint is a [ConflictError], never applied and never silently
// skipped. Records expire after [Config.Retention]; [Store.GC] deletes
// expired ones in bounded batches.
//
// Storage: keys that are canonical UUIDs are stored natively; other keys as
// a SHA-256-derived UUID plus their text. A record with a random UUID key
// takes about 177 bytes including its primary-key index, 200 with the
// expires_at index (BenchmarkRecordSize, one million records).
package inbox
