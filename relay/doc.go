// Package relay publishes the messages of an outbox (package outbox) to
// brokers and endpoints: a [Relay] claims due rows in batches, hands them
// to a [Sink] (usually a [Router] that picks a Sink per destination),
// deletes what was delivered, reschedules failures with exponential backoff
// and full jitter, and moves messages it gives up on to the dead letters.
//
// # Delivery
//
// At least once, and exactly once in steady state: a row is deleted in the
// transaction that claimed it, after the Sink returned, so a relay that
// dies between publishing and committing publishes those rows again from
// wherever the next claim runs. The duplicate carries the same message id
// (the row's UUIDv7), which the receiving inbox or the broker's duplicate
// window drops. Several relays, in one process ([Config.Workers]) or many,
// never claim a row twice while they are alive.
//
// # Order
//
// Messages with the same key are published in enqueue order, also across
// relays, failures and retries. The keys are hashed into 64 partitions,
// and every partition is leased to one worker at a time (each of a
// relay's [Config.Workers] is a member of its own): only the owner claims
// or moves the rows of its keys, so it keeps their order in memory. It
// reads the outbox in seq order; a row that is not due, or that it put
// back after a failure (same seq, so the same place in its key's order,
// with a later available_at), blocks its key, whose later rows wait. A
// failing row holds back only the later rows of its own key. Messages
// without a key are unordered, never wait and are shared by all workers.
// When a key's head becomes a dead letter its followers proceed, unless
// [Config.ParkFollowers] keeps them until the dead letter is replayed or
// purged. Within a batch a Sink must keep order too (see [Sink]).
//
// # Partitions and leases
//
// The outbox's migrations create a table of relay workers and a lease
// table with one row per partition. A worker keeps its row alive (a
// heartbeat every [Config.LeaseTTL]/3) and, between batches, at most
// every LeaseTTL/10, takes or gives up partitions so that each of n live
// workers owns about ceil(64/n): a relay that joins gets its share within
// a second or two of starting, a relay that stops gives its partitions
// up at once. A relay that dies (SIGKILL, lost host) leaves its
// partitions to the others once its heartbeat is LeaseTTL old (10 seconds
// by default); until then the messages of its keys wait. Its batch in
// flight rolls back with its connection, so nothing is lost, and what it
// had published but not deleted is published again with the same ids.
//
// A takeover increments the partition's fencing token. Every batch locks
// its worker's lease rows FOR SHARE and checks their tokens before it
// scans, and holds them until it commits, so a takeover cannot happen
// while the previous owner's batch is in flight, and a worker that lost a
// partition (it stalled past LeaseTTL) finds out before it claims
// anything. The dead-letter operations of package outbox (Replay, Purge
// and the release of parked followers) lock the lease rows of the keys
// they touch in the same way, waiting for the owner's batch, and tell the
// owner to read its partitions again from the start.
//
// # Writing a Sink
//
// A [Sink] publishes a batch and reports per-message failures in a
// *[PublishError]. [Failures] keeps the contract's order rule (skip the rest
// of a key once one of its messages failed) and builds the error; [Rounds]
// plans the calls when a key's messages go to several destinations. The
// relay and the [Router] turn a Sink's panic into a failure of its batch
// ([ErrSinkPanicked]). Package relaytest checks a Sink against the contract
// on a real broker; package relaytest/history checks a recorded history of
// publishes (order, fences, loss), for which a Sink records each
// [Message]'s Seq, Partition and LeaseToken.
//
// # Waking up
//
// The relay LISTENs on a dedicated connection (not from the pool, so the
// pool may sit behind a transaction-mode pooler; see
// [Config.ListenConnString]) and claims as soon as a writer's transaction
// commits; it polls every [Config.PollInterval] as a fallback and after
// reconnecting. While rows keep coming it claims batch after batch; when a
// claim comes back empty it sleeps until the next notification or poll.
// Writers send at most one NOTIFY per outbox.Config.NotifyInterval (a
// NOTIFY serialises commits cluster-wide), so after every wake-up the relay
// also polls at that interval for 50 intervals, which finds the rows of
// the transactions that skipped theirs.
//
// # Lifecycle
//
// A [Relay] is an idemq.Service: [Relay.Run] checks that the outbox's
// tables exist, closes [Relay.Ready] once it listens (or polls, with
// [Config.DisableListen]) and blocks until its context is done, then stops
// claiming and gives in-flight batches [Config.ShutdownGrace] to finish;
// rows of batches still in flight after that are released, not lost. Run
// returns an error, instead of retrying forever, when the tables are
// missing (the migrations did not run) or the pool was closed; passing
// database and Sink errors are logged and retried. A second concurrent Run
// returns idemq.ErrRunning; a Run after the previous one returned works.
//
// # Workers and timeouts
//
// More [Config.Workers] (or more relays) help when there are many keys and
// a slow Sink: each worker owns its share of the partitions. A batch holds
// its rows in an open transaction while the Sink publishes them, at most
// [Config.PublishTimeout]; the relay sets idle_in_transaction_session_timeout
// a little above it, so the server ends the transaction, and releases the
// rows, if the relay vanishes without closing its connection.
//
// # Scanning and dead tuples
//
// Each worker reads the unkeyed rows and the rows of each of its
// partitions in seq order, through the outbox's (partition, seq) index, from
// a cursor per partition: the next scan of a partition starts after the
// last row read from it, so it never reads again through the rows that
// were deleted behind it. Deleted rows stay in the table as dead tuples
// until vacuum removes them, and a long-running transaction anywhere keeps
// them visible to itself, so a scan that started from the beginning would
// read through all of them (the drain of a large backlog would slow down
// with every row published). A batch takes the partitions in turn, so a
// partition with a large backlog does not hold back the others. A worker
// that owns every partition (a relay alone, with one worker) reads the
// whole outbox in seq order through the primary key instead, with one
// cursor: a partition's rows lie far apart in the table, and a batch of
// neighbouring rows costs less. The
// cursors go back only to rows the worker itself left behind once they
// are due (retries), to the beginning after it took over a partition or a
// dead-letter operation moved rows of its partitions, and every
// [Config.RescanInterval] (a safety net, 1 minute by default).
//
// A transaction that draws seqs and commits after later seqs were
// published must not be overtaken, so the cursors never pass the
// horizon: the sequence's value as of a moment after which every
// transaction that then held the outbox table's RowExclusiveLock (which a
// writer holds from before it draws a seq until it ends) has ended. A
// long transaction that wrote to the outbox holds the cursors back until
// it ends; a long transaction that did not, does not. (The outbox's
// sequence must keep its default CACHE 1, and the relay's role needs the
// SELECT privilege on it.)
//
// Vacuum is still what removes dead tuples: the migration sets aggressive
// per-table autovacuum parameters. A server where autovacuum is off or too
// slow can have the relay run VACUUM itself every [Config.VacuumEvery]
// claimed rows; that is off by default, since it needs the table owner's
// rights.
//
// # Cost
//
// Measured on a 2-core machine that also runs the server (see the
// benchmarks; figures in the commit history), into a no-op Sink with
// batches of 500: a lone relay drains keyed rows at 0.55 to 0.95 of the
// rate of a bare DELETE ... LIMIT 500 FOR UPDATE SKIP LOCKED RETURNING loop
// (1,000 or 100,000 keys alike; about 0.8 in most runs) and unkeyed rows at
// 0.65 to 0.8 of it; two relays, each reading its half of the partitions,
// drain 0.85 to 1.15 times as fast as one on that machine (the server, on
// the same two cores, is the limit there); and a transaction held open
// elsewhere for 10 s leaves the drain of a keyed backlog at 0.9 to 0.95 of
// its rate, without a slower trend. A
// batch costs three round trips (lease check and scan, delete, settle and
// commit), a row lock on each of its worker's lease rows, and no per-key
// work in the database.
package relay
