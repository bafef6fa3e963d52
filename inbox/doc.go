// Package inbox is the Postgres record of every message a consumer applied.
//
// A [Store] keeps one [Record] per (scope, key): the scope names the
// consumer (two consumers of one message each apply it once), the key is
// the message id or a business key. The record is written in one of two
// ways:
//
//   - Transactional: a consumer (package consumer, the one path that
//     claims keys) writes the record SUCCEEDED inside the pgx.Tx that
//     carries the message's side effects, begun with the claim in one
//     round trip, or for a whole batch with one statement. The claim
//     exists if and only if those effects committed, so a failed handler
//     never marks a message as seen; the consumer then counts the failed
//     attempt (FAILED_RETRYABLE) in a transaction of its own, and the next
//     claim takes that record over. Two transactions claiming one key
//     serialise on the primary key (or, for a failed key, on its row
//     lock): the second waits, then sees a duplicate if the first
//     committed or claims the key if it rolled back.
//
//   - Leased, for side effects outside Postgres: [Store.Acquire] marks the
//     record IN_PROGRESS for an owner until a deadline and hands out a
//     fencing token that grows with every claim and takeover. [Store.Complete],
//     [Store.Fail] and [Store.FailFinal] are compare-and-set on that token, so a worker
//     whose lease expired and was taken over can never overwrite the result
//     of its successor; pass the token downstream so the far side can reject
//     a stale writer too.
//
// A record carries a fingerprint of the payload: the same key with another
// fingerprint is a [ConflictError], never applied and never silently
// skipped. Records expire after [Config.Retention]; [Store.GC] deletes
// expired ones in bounded batches.
//
// Dead letters (FAILED_FINAL records) and conflicts are managed as the
// outbox's dead letters are: [Store.DeadLetters] and [Store.Conflicts] list
// them by [DeadFilter] (scope, key, class, age); [Store.Release] lets the
// next delivery apply the message, [Store.Purge] forgets it, each on dead
// letters or, with DeadFilter.Conflicts, on conflicts (a released
// conflict's payload is applied once, and the payload applied before it
// stays a duplicate); [Store.Stats] counts records by status, and
// conflicts.
//
// Crashed consumers: a process killed while one of its statements runs
// (waiting on a lock, say) leaves a backend that holds its uncommitted
// claims until that statement ends, and the key's next owner waits behind
// it. The transactions a consumer begins to claim keys therefore set
// client_connection_check_interval ([Config.ConnectionCheckInterval], 2
// seconds by default), so the server ends such a backend within seconds.
// This needs Postgres 14 or later on Linux; on older servers set
// [ConnectionCheckDisabled].
//
// Methods follow River's rule: a name ending in Tx runs in the caller's
// pgx.Tx and commits or rolls back with it; the same name without Tx runs
// on the Store's own handle given to [New].
//
// Storage: keys that are canonical UUIDs are stored natively; other keys as
// a SHA-256-derived UUID plus their text. A record with a random UUID key
// takes about 177 bytes including its primary-key index, 200 with the
// expires_at index (BenchmarkRecordSize, one million records).
//
// # Partitioned layouts
//
// At millions of messages a day, expiring records by DELETE writes WAL and
// dead tuples for every one and keeps VACUUM busy. [Config.Partitioning]
// lays the table out in partitions instead, and expiry drops a whole past
// partition: a third of a byte of WAL per record against hundreds
// (BenchmarkPartitionedStorage), and no expires_at index.
//
//   - [PartitionByKey], for keys that are UUIDv7 (idemq's outbox ids):
//     the partition is a function of the key's time, so uniqueness stays
//     exact and a claim touches one partition.
//   - [PartitionByArrival], for keys of any form: partitions by arrival
//     time, a claim probing the current and the previous one. Two copies
//     of one key claimed on either side of a boundary while both are
//     uncommitted are serialised by a transaction-scoped advisory lock on
//     the key within [Config.BoundaryGrace] of each boundary.
//
// [Store.GC] drops expired partitions (DETACH … CONCURRENTLY, then DROP)
// and creates the next ones (a plain table with a CHECK constraint, then
// ATTACH: SHARE UPDATE EXCLUSIVE on the inbox, no scan); no extension is
// needed. Run GC at least once per [Config.PartitionInterval]: the
// maintenance service does ([Store.Chores], consumer.Consumer.Maintenance);
// past the partitions made ahead a claim fails with [ErrNoPartition].
//
// Moving a live inbox: the partitioned Config's migration (version 8)
// turns the existing table into the new parent's first partition,
// bucket 0, so every record stays and claims keep finding its keys; GC
// drops it once nothing in it is unexpired. On a big table, first run
// [Store.PrepareLivePartitioning] outside a transaction (idemq migrate
// --inbox-partitioned does): it adds the bucket column (no rewrite) and
// builds what the migration needs with CREATE UNIQUE INDEX CONCURRENTLY and
// a check validated under SHARE UPDATE EXCLUSIVE, so the migration itself
// only renames and attaches. Stop the consumers of the old Config, migrate,
// start them with the partitioned Config: a Store with the plain Config
// refuses the partitioned table (idemq.ErrConfig, from Migrate and from
// its first claim) rather than writing past it. Down to version 7 copies
// the partitions back into one plain table.
package inbox
