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
// Messages with the same key to the same destination are published in
// enqueue order, also across relays, failures and retries: a key failing
// on one destination does not hold back its messages to another
// ([Config.GlobalKeyOrder] keeps one order per key across all
// destinations instead). The keys are hashed into 64 partitions, and every
// partition is leased to one worker at a time (each of a relay's
// [Config.Workers] is a member of its own): only the owner claims or moves
// the rows of its keys, so it keeps their order in memory. It reads the
// outbox in seq order; a row that is not due, that it put back after a
// failure (same seq, so the same place in its key's order, with a later
// available_at), or that another session holds locked (an operator's
// SELECT ... FOR UPDATE or UPDATE, a stale owner) blocks its key, whose
// later rows wait; the owner looks at a locked row again every
// [Config.PollInterval]. A failing row holds back only the later rows of
// its own key. Messages without a key are unordered, never wait and are
// shared by all workers (one that another session holds is left to it).
// When a key's head becomes a dead letter its followers proceed, unless
// [Config.ParkFollowers] keeps them until the dead letter is replayed or
// purged. Within a batch a Sink must keep order too (see [Sink]).
//
// # Partitions and leases
//
// The outbox's migrations create a table of relay workers and a lease
// table with one row per partition. A relay registers all its workers
// when it starts and keeps their rows alive (a heartbeat every
// [Config.LeaseTTL]/3) on a connection of its own, so a busy pool, whose
// connections all wait on a slow Sink, never delays a renewal. Between
// batches, at most every LeaseTTL/10, a worker takes or gives up
// partitions so that each of n live workers owns about ceil(64/n): a relay
// that joins gets its share within a second or two of starting, a relay
// that stops gives its partitions up at once. A relay that dies (SIGKILL,
// lost host) leaves its partitions to the others once its heartbeat is
// LeaseTTL old (10 seconds by default); until then the messages of its
// keys wait. Its batch in flight rolls back with its connection, so
// nothing is lost, and what it had published but not deleted is published
// again with the same ids.
//
// A takeover increments the partition's fencing token. Every batch locks
// its worker's lease rows FOR KEY SHARE and checks their tokens before it
// claims, and holds them until it commits, so a takeover (FOR UPDATE)
// cannot happen while the previous owner's batch is in flight, and a
// worker that lost a partition (it stalled past LeaseTTL) finds out before
// it claims anything. An owner that stalls in the middle of a batch (a
// pause, a network that holds its packets) has its transaction ended by
// the server once it has been idle for PublishTimeout + LeaseTTL/3
// (idle_in_transaction_session_timeout), counted from the end of the
// claim; and it starts no publish, and gives its Sink no more time, past
// PublishTimeout after it sent the claim, or once its last successful
// heartbeat is LeaseTTL old. So an owner never publishes after the moment
// its successor may start, however late the answer to its claim arrives;
// it rolls back instead, without counting an attempt. The dead-letter
// operations of package outbox (Replay, Purge, RetryNow and the release of
// parked followers) bump the generation of the lease rows of the keys they
// touch, which does not conflict with that lock: they do not wait for the
// owner's batch, and an operator's transaction left open does not stop
// the owner. The owner's claim takes nothing once the generations it read
// moved, and its next batch reads its partitions again from the start, so
// a replayed message still goes before the later messages of its key.
// Nor does such a transaction stop the partitions changing hands: giving
// partitions up and taking them skip the lease rows it holds (SKIP
// LOCKED), so no worker waits for it. The one bound: a partition whose
// lease row it holds keeps its owner until it ends. A live owner keeps
// publishing it; a dead owner's (or one that stopped) is taken over
// within LeaseTTL/10 after the operator commits or rolls back. A replay
// of unkeyed dead letters holds every partition (every worker reads the
// unkeyed rows), a keyed one those of its keys.
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
// A Sink that commits each batch in a broker transaction fenced by the
// partition's lease token (the transactional Kafka sink of package
// transports/kafka/franz) implements [Watermarker]: when a worker takes a
// partition, and after a failed round or publish of it, the relay deletes
// without publishing the rows the partition's last committed watermark
// names, so a crash between the broker's commit and the relay's delete
// publishes nothing twice. Each call carries its batch's [BatchID], which
// a [Router] passes on to every destination's call and a wrapping Sink
// passes on too: such a Sink names the rows of all the calls of a batch in
// one watermark.
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
// A [Relay] is an idemq.Service: [Relay.Run] checks that the server takes
// writes (a standby or a read-only server is an idemq.ErrConfig error),
// that the outbox's tables exist and that their sequence keeps order (see
// below), closes [Relay.Ready] once it listens (or polls, with
// [Config.DisableListen]) and blocks until its context is done, then stops
// claiming and gives in-flight batches [Config.ShutdownGrace] to finish;
// rows of batches still in flight after that are released, not lost. Run
// returns an error, instead of retrying forever, when the server is
// read-only, the tables are missing (the migrations did not run), the
// sequence is set to CACHE > 1 or the pool was closed; passing
// database and Sink errors are logged and retried. A second concurrent Run
// returns idemq.ErrRunning; a Run after the previous one returned works.
//
// # What the relay tells the operator
//
// [Config.Logger] gets one line per change of state, never one per
// message (see monitor.go): a destination starts failing (its broker or
// webhook endpoint away or refusing), with the error, and stops; a destination is held ([ErrNoRoute], a Sink's hold) and
// released; the database goes away and comes back; a worker acquires,
// releases, takes over or loses key partitions (with tokens, the previous
// owner, the new one); dead letters, one line per batch; every
// [Config.StatsInterval] a backlog line while messages are pending; a
// stall, when a message free to go has been due longer than
// [Config.StallThreshold]; and a warning when LISTEN receives nothing (a
// transaction-mode pooler: set [Config.ListenConnString]). The hooks count
// rows: [Hooks.OnFailed] attempted publishes that failed, [Hooks.OnHeld]
// and [Hooks.OnSkipped] rows put back without an attempt.
//
// # Workers and timeouts
//
// More [Config.Workers] (or more relays) help when there are many keys and
// a slow Sink: each worker owns its share of the partitions. A batch holds
// its rows in an open transaction while the Sink publishes them, at most
// [Config.PublishTimeout]; the relay sets idle_in_transaction_session_timeout
// to PublishTimeout + LeaseTTL/3, so the server ends the transaction, and
// releases the rows, if the relay vanishes without closing its connection.
// So a relay that stalls in the middle of a batch (a paused process, a
// network that holds its packets) keeps its partitions until the later of
// PublishTimeout + LeaseTTL/3 after its claim and LeaseTTL after its last
// heartbeat: 33.3 seconds on the defaults (30 s + 10 s/3). One that stalls
// between batches keeps them LeaseTTL after its last heartbeat (10 s); one
// that stops gives them up at once. Shorten PublishTimeout (the transports
// bound one request at 10 to 15 s) to shorten the first; the relay refuses
// values outside [PublishTimeoutMin] and [PublishTimeoutMax].
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
// are due (retries) or to a row another session held locked, to the
// beginning after it took over a partition or a dead-letter operation
// moved rows of its partitions, to where they passed the horizon once the
// horizon gets there (below), and every [Config.RescanInterval] (a safety
// net, 1 minute by default).
//
// A transaction that draws seqs and commits after later seqs were
// published must not be lost, nor overtaken by a row of its key enqueued
// after it committed. The horizon is the sequence's value as of a moment
// after which every transaction that then held the outbox table's
// RowExclusiveLock (which a writer holds from before it draws a seq until
// it ends) has ended; a prepared transaction (two-phase commit) counts
// until COMMIT or ROLLBACK PREPARED. The cursors go past it, so that rows
// that are not due or wait behind a failing row of their key never stop
// the rows after them, however long a writer stays open; every scan then
// also reads, from the seq where a cursor first passed the horizon, the
// due rows of keys that are not blocked (the rows that committed late),
// and once the horizon gets there the cursors go back to it. A long
// transaction that wrote to the outbox costs each scan a read through the
// rows since the horizon; a long transaction that did not, costs nothing.
// The relay's role needs the SELECT privilege on the outbox's sequence,
// which must keep its default CACHE 1 (with more, sessions hand out seqs
// out of order) and never go back below the seqs in use: Run refuses both
// at start, with the statement that fixes them (outbox.Outbox.CheckSequence;
// `idemq migrate validate` reports the same). A CACHE raised while the
// relay runs ends Run; TRUNCATE (RESTART IDENTITY or not), VACUUM FULL,
// CLUSTER or a restarted sequence (ALTER SEQUENCE ... RESTART, setval),
// noticed within a second by a new file of the table or of the sequence
// (however many values were drawn since) or a last value below the one
// seen, makes the workers drop the batch they read and read the outbox
// from the start, or ends Run, as at start, when rows or dead letters
// are left above the sequence.
//
// Vacuum is still what removes dead tuples: the migration sets aggressive
// per-table autovacuum parameters. A server where autovacuum is off or too
// slow can have the relay run VACUUM itself every [Config.VacuumEvery]
// claimed rows; that is off by default, since it needs the table owner's
// rights.
package relay
