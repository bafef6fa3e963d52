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
// relays, failures and retries: a batch takes the rows of a key only from
// the key's head and only while holding a transaction-scoped advisory lock
// on the key, so no two batches ever hold rows of one key. A failing row
// is put back in its place with a later available_at and holds back only
// the later rows of its own key. Messages without a key are unordered and
// never wait. When a key's head becomes a dead letter its followers proceed,
// unless [Config.ParkFollowers] keeps them until the dead letter is
// replayed or purged. Within a batch a Sink must keep order too (see
// [Sink]).
//
// # Writing a Sink
//
// A [Sink] publishes a batch and reports per-message failures in a
// *[PublishError]. [Failures] keeps the contract's order rule (skip the rest
// of a key once one of its messages failed) and builds the error; [Rounds]
// plans the calls when a key's messages go to several destinations. The
// relay and the [Router] turn a Sink's panic into a failure of its batch
// ([ErrSinkPanicked]). Package relaytest checks a Sink against the contract
// on a real broker.
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
// The [Config.Workers] of one relay split the ordering keys among
// themselves by hash (unkeyed rows go to whichever is free), so more
// workers help when there are many keys and a slow Sink. A batch holds its
// rows in an open transaction while the Sink publishes them, at most
// [Config.PublishTimeout]; the relay sets idle_in_transaction_session_timeout
// a little above it, so the server ends the transaction, and releases the
// rows, if the relay vanishes without closing its connection.
//
// # Scanning and dead tuples
//
// Each claim scans the outbox in primary-key order from where the previous
// full batch began, and from the start at least every
// [Config.RescanInterval] and whenever a batch comes back short, so rows of
// transactions that committed late are never stranded. Deleted rows stay
// in the table as dead tuples until vacuum removes them; a scan from the
// start reads through them (cheaply once a scan has marked their index
// entries dead, which happens as soon as no open transaction can see them).
// A long-running transaction keeps them visible to itself, so while it
// lasts the full scans slow down with every row published; the cursor keeps
// busy relays fast meanwhile. The per-key head check probes the outbox's
// (key, seq) index, whose low end per key collects dead entries the same
// way. Vacuum is what removes them: the migration sets aggressive per-table
// autovacuum parameters. A server where autovacuum is off or too slow can
// have the relay run VACUUM itself every [Config.VacuumEvery] claimed rows;
// that is off by default, since it needs the table owner's rights.
//
// # Cost
//
// Measured on a 2-core machine (see the benchmarks; figures in the commit
// history): into a no-op Sink with batches of 500, unkeyed rows drain at
// about two thirds of the rate of a bare DELETE ... LIMIT 500 FOR UPDATE
// SKIP LOCKED RETURNING loop; keyed rows at 0.35 to 0.5 of it, because
// every distinct key of a batch costs one index probe (its head must be
// checked under a snapshot taken after its lock). Each distinct key of a
// batch also holds an advisory lock until the batch commits.
package relay
