// Package outbox is the transactional outbox: messages written in the same
// Postgres transaction as the business rows they describe, published later
// by a relay (package relay) if and only if that transaction committed.
//
// # Enqueue
//
// An [Outbox] owns the handle given to [New] (a pool, usually), which
// [Outbox.Migrate], [Outbox.Enqueue] and the dead-letter calls use; the
// calls ending in Tx run in the caller's transaction instead, River's rule.
// [Outbox.EnqueueTx] inserts messages inside the caller's pgx.Tx, with one
// round trip per call (a multi-row INSERT from arrays, or COPY for large
// calls) and a NOTIFY that wakes the relays when the transaction commits
// (at most one per [Config.NotifyInterval] across transactions: a NOTIFY
// makes its commit take a cluster-wide lock until the commit is flushed).
// Every message is validated first ([ErrInvalidMessage]): a refused call
// leaves the transaction untouched. Each message gets a UUIDv7 id unless
// the caller set one; the id travels downstream as the message id, so the
// receiving inbox drops the duplicates a relay crash creates.
//
// # Enqueue from SQL
//
// The migrations install a function beside the table, <schema>.<table>_enqueue
// (public.idemq_outbox_enqueue by default), for writers that cannot call
// EnqueueTx: triggers on business tables, data migrations, services in
// other languages. It takes (destination, key, payload, headers jsonb),
// validates them as EnqueueTx does (an error with a SQLSTATE instead of a
// row; payloads up to the idemq.max_payload setting, 1 MiB by default),
// writes the same row inside the caller's transaction, so that it keeps its
// place in its key's order among rows written from Go, notifies the relays
// on the default channel at most once per idemq.notify_interval_ms (5 by
// default) per session, and returns the message's UUIDv7 id:
//
//	SELECT public.idemq_outbox_enqueue('orders', 'customer-7', '{"id": 42}', '{"content-type": "application/json"}');
//
// # Notifications
//
// A NOTIFY makes its transaction's commit take a cluster-wide lock until
// the commit is flushed, so notifying writers lose group commit: 16
// concurrent writers notifying in every transaction commit about a third
// as many transactions per second (see the relay benchmarks). An Outbox
// therefore sends at most one NOTIFY per [Config.NotifyInterval], and
// relays poll at that interval for a while after each wake-up, which finds
// the rows of the transactions that skipped theirs. The one case that
// waits for the relay's poll interval: the transaction that did notify
// rolled back and no other transaction notified after it. The default
// channel is derived from the schema and table; where that is longer than
// Postgres' 63 bytes it is shortened with a hash, the same way in every
// process.
//
// # Order
//
// Rows are numbered from a sequence when they are inserted. The relay
// publishes the rows of one key in that order, and a transaction that
// enqueues after another committed always numbers higher: serialise the
// writers of one key (as the business row they change usually does) and
// their messages keep their order end to end. Two transactions that run
// concurrently enqueue in no defined order with respect to each other.
//
// # Dead letters
//
// The relay moves a message it gives up on to the dead-letter table beside
// the outbox ([Config.Table]+"_dead"), with its error. [Outbox.DeadLetters]
// lists them, [Outbox.Replay] puts them back (attempts reset, same id, same
// place in their key's order) and [Outbox.Purge] deletes them, those a
// [DeadFilter] selects: a filter that narrows nothing must say
// [DeadFilter].All, and a blank value is refused, so that a field left
// empty by mistake never replays or purges everything. Both bump
// the generation of the relays' lease rows of the partitions of the keys
// they touch (the tables [Config.Table]+"_lease" and +"_relays"; see the
// relay package): the relay that owns them reads them again from the
// start, and its batch in flight claims nothing more. They do not wait for
// the relay, and a ReplayTx or PurgeTx left open does not stop it: until
// it commits the relay sees the dead letters where they were.
// [Outbox.RetryNow] sends the pending messages of a destination that works
// again without waiting out their retry delays, the same way.
//
// # Storage and vacuum
//
// The outbox is a queue: every row is inserted once and deleted once,
// seconds later. Deleted rows stay in the table as dead tuples until vacuum
// removes them, and a scan that passes them reads through them (cheaply
// once a scan has marked their index entries dead, which happens as soon
// as no open transaction can see them). The relay scans forward from a
// cursor and rarely goes back over deleted rows, but vacuum is still what
// keeps the table small: the migration therefore sets per-table autovacuum
// parameters (vacuum after every 10,000 dead rows instead of after 20% of
// the table, unthrottled); since autovacuum may be off or slow on a
// server, the relay can vacuum the table itself (relay.Config.VacuumEvery,
// off by default). A long-running transaction anywhere in the database
// holds back the horizon: no dead row deleted after it began can be
// removed, so keep transactions short or set
// idle_in_transaction_session_timeout. A transaction that wrote to the
// outbox and stays open also holds back the relay's cursor (its rows may
// still commit), which then reads through what was deleted behind it.
//
// The relay holds its claimed rows in an open transaction while it
// publishes them, which also holds the horizon for that long; the relay's
// PublishTimeout bounds it.
package outbox
