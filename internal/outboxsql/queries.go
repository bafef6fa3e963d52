// Package outboxsql holds every statement on an outbox table and its
// dead-letter table, for the two packages that use them: outbox (enqueue,
// dead letters, stats) and relay (claim and settle). A column or a lock
// rule changes here, once. The statements are built once per table from
// validated, quoted identifiers; nothing is assembled from user input at
// run time.
package outboxsql

import (
	"encoding/json"
	"fmt"

	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/internal/pgutil"
)

// Partitions. The relays lease hash partitions of the ordering keys (the
// tables of migration 0002): a worker claims the rows of a key only while it
// owns the key's partition, and holds the partition's lease row FOR KEY
// SHARE in every batch, after checking the lease's token (a takeover, FOR
// UPDATE, waits for it). Whoever else moves rows of a key (Replay, Purge,
// Unpark, RetryNow) bumps the gen of the keys' partitions, which neither
// waits for the owner's batch nor makes the owner wait: the owner's claim
// takes nothing once the gens it saw moved, and its next batch reads the
// partitions again from the start.
const (
	// Partitions is the number of key partitions (the rows of the lease
	// table that migration 0002 creates).
	Partitions = 64
	// Cluster reads what names the database among those of every
	// Postgres cluster: the cluster's system identifier (set by initdb,
	// kept by its replicas) and the database's name.
	Cluster = `SELECT system_identifier::text, current_database() FROM pg_control_system()`
	// partOf is the partition of the key column or parameter k.
	partOf = `mod(hashtext(%s)::int8 + 2147483648, 64)::int4`
	// partition is a row's partition, -1 for unkeyed rows: the expression
	// of the outbox's (partition, seq) index, which only this exact text
	// uses.
	partition = `coalesce(mod(hashtext(key)::int8 + 2147483648, 64)::int4, -1)`
	// oPartition is partition for the table aliased o.
	oPartition = `coalesce(mod(hashtext(o.key)::int8 + 2147483648, 64)::int4, -1)`
	// orderOf is the scan's order id of row o: 0 for unkeyed rows, an odd
	// 64-bit hash of the key, per destination unless parameter %s is true
	// (Config.GlobalKeyOrder). Two keys that collide only wait for each
	// other.
	orderOf = `CASE WHEN o.key IS NULL THEN 0
     ELSE hashtextextended(o.key, CASE WHEN %[1]s THEN 0 ELSE hashtext(o.destination) END) | 1 END`
	// due is a scanned row's wait in microseconds: 0 due, -1 parked.
	due = `CASE WHEN o.available_at <= now() THEN 0
     WHEN o.available_at = 'infinity' THEN -1
     ELSE ceil(extract(epoch FROM o.available_at - now()) * 1000000)::int8 END`
	// held locks scanned row o if it is due and unkeyed, skipping it when
	// another session holds it. Keyed rows are read without a lock: the
	// claim locks them (one that another session holds then blocks its
	// key instead of vanishing from the window).
	held = `LEFT JOIN LATERAL (SELECT true AS ok FROM %s AS x WHERE x.ctid = o.ctid AND o.key IS NULL AND o.available_at <= now()
                   FOR UPDATE SKIP LOCKED) AS h ON true`
	// scanned keeps the rows a batch must see: every keyed row, unkeyed
	// rows that are not due (to come back to) or that this batch holds. An
	// unkeyed row that another session holds is left to it, as SKIP
	// LOCKED does.
	scanned = `(o.key IS NOT NULL OR o.available_at > now() OR h.ok)`
)

// NoRoute starts the text of relay.ErrNoRoute, which the relay stores as
// the last error of a message it holds because no route matches its
// destination; Stats counts such messages by it.
const NoRoute = "relay: no sink for destination"

// behind keeps, of the rows before cursor, only the due ones whose order
// id (global is orderOf's parameter) is not in blocked: rows that committed
// after the cursor passed their seqs, unless their key is blocked anyway.
func behind(cursor, global, blocked string) string {
	return `(o.seq >= ` + cursor + ` OR (o.available_at <= now() AND ` + fmt.Sprintf(orderOf, global) + ` <> ALL(` + blocked + `)))`
}

// Columns are the columns Enqueue writes, in the order of Insert's arrays
// and of a COPY.
var Columns = []string{"id", "destination", "key", "payload", "headers"}

// Queries are the statements on one outbox table.
type Queries struct {
	// Table is the outbox table, Dead its dead-letter table, Lease and
	// Relays its partition lease and relay worker tables (quoted,
	// schema-qualified), for messages and for Exists' arguments.
	Table, Dead, Lease, Relays string

	// Insert writes rows from arrays ($1 ids, $2 destinations, $3 keys,
	// $4 payloads, $5 headers as JSON text), numbered in array order.
	Insert string
	// Notify wakes the relays listening on channel $1 at commit.
	Notify string
	// Exists reports whether the tables named $1, $2 and $3 exist.
	Exists string
	// Stats counts pending rows and the age of the oldest; the rows not
	// due yet (waiting for a retry or held), parked, and held because no
	// route matches ($1 = NoRoute); how long the longest-waiting due row
	// whose key has no row waiting has been due (seconds, NULL: none);
	// and the dead letters.
	Stats string
	// Owners returns the owner and token of partitions $1.
	Owners string
	// Vacuum vacuums the outbox table (simple protocol, outside a tx).
	Vacuum string
	// Waiting returns the distinct keys of the rows of destination $1
	// that wait for a later time (not parked behind a dead letter), and
	// whether some have no key. RetryNow makes those of keys $2 (and the
	// unkeyed ones if $3) due now and counts them, leaving rows of a batch
	// in flight (locked) to that batch. Between the two, LockPartitions
	// has the owners read the partitions again (see the relay's claim.go).
	Waiting, RetryNow string

	// SequenceState returns, for the outbox table named $1, its seq
	// sequence's name, CACHE and last value (0 for none), and the highest
	// seq of the outbox and its dead letters (0 for none).
	SequenceState string
	// Writable reports whether the server is a standby (in recovery) and
	// whether the session's transactions are read-only: a relay refuses
	// both at start.
	Writable string

	// Join, Beat, Live, Take, Release, Leave, Hold, Lock, Sequence, Top, Writers,
	// Scan, ScanAll, Nodes, Claim, PutBack, Bury and Park are the relay's; see
	// their comments below and the relay package's claim.go and lease.go.
	Join, Beat, Live, Take, Release, Leave, Hold, Lock, Sequence, Top, Writers string
	Scan, ScanAll, Nodes, Claim, ClaimParked, PutBack, Bury, Park              string
	// Delivered deletes the rows of partition $1 with seq in $2: rows a
	// transactional Sink's last committed transaction delivered (see the
	// relay's Watermarker), which a crash or a failed commit left behind.
	Delivered string

	// ListDead lists dead letters by the DeadFilter parameters ($1-$8,
	// $10) up to $9. LockDead locks them (seq, key) for Replay and Purge,
	// LockPartitions bumps the gen of the partitions of the keys in $1
	// (all of them if $2), in partition order, without waiting for their
	// owners' batches; Replay moves the dead letters with seq in $1 back,
	// Purge deletes them, and Unpark releases the rows parked behind keys
	// in $1 that have no dead letter left on their destination.
	ListDead, LockDead, LockPartitions, Replay, Purge, Unpark string

	// DeadGroups groups the dead letters that match the DeadFilter
	// parameters ($1-$8) by error class and destination: class (NULL:
	// unclassified), destination, count, first and last failure, and the
	// id and error of the oldest, most numerous groups first, up to $9.
	// GroupSummary answers the same from the summary of migration 0006,
	// for a filter of destination ($1), destination prefix ($2) and error
	// class ($3) alone, up to $4 groups.
	DeadGroups, GroupSummary string
	// DeadSince counts the dead letters that failed at or after $1 by
	// destination, from the (failed_at) INCLUDE (destination) index of
	// migration 0006.
	DeadSince string
	// Parked counts the parked rows by destination, from the partial
	// index of migration 0007.
	Parked string
	// Unclassified returns up to $1 dead letters (seq, last_error) stored
	// without an error class; Classify sets the classes $2 of seqs $1.
	Unclassified, Classify string

	// GaugeEdges, GaugeSample, GaugeStats, GaugePartitions and
	// GaugeRelays are the statements of outbox.Gauges, each reading index
	// edges or a bounded slice of an index, never the whole table: see
	// their comments below.
	GaugeEdges, GaugeSample, GaugeStats, GaugePartitions, GaugeRelays string

	// ByKey lists up to $2 pending rows of key $1 in seq order among the
	// oldest $3 rows of its partition, through the (partition, seq) index
	// (the outbox has no index on key: every enqueue would pay for it):
	// seq, id, destination, attempts, created_at, available_at,
	// last_error.
	ByKey string

	// Audit writes an entry of the audit log (migrations 0004 and 0005):
	// $1 actor, $2 action, $3 target, $4 filter (JSON text), $5 rows, $6
	// outcome. AuditLog
	// reads up to $2 entries older than id $1 (NULL: the latest), latest
	// first.
	Audit, AuditLog string
}

// deadWhere is the dead-letter filter: static SQL whose parameters are NULL
// when a filter field is unset ($1 ids, $2 destination, $3 destination
// prefix, $4 key, $5 failed before, $6 failed at or after, $7 error class,
// where Unclassified matches rows stored without one, $8 key prefix, $10
// the id of the dead letter to list after, in seq order: keyset
// pagination through the id index and the primary key).
const deadWhere = `($1::uuid[] IS NULL OR id = ANY($1))
  AND ($2::text IS NULL OR destination = $2)
  AND ($3::text IS NULL OR starts_with(destination, $3))
  AND ($4::text IS NULL OR key = $4)
  AND ($5::timestamptz IS NULL OR failed_at < $5)
  AND ($6::timestamptz IS NULL OR failed_at >= $6)
  AND ($7::text IS NULL OR error_class = $7 OR ($7 = '` + Unclassified + `' AND error_class IS NULL))
  AND ($8::text IS NULL OR starts_with(key, $8))
  AND ($10::uuid IS NULL OR seq > (SELECT a.seq FROM %[1]s AS a WHERE a.id = $10 ORDER BY a.seq LIMIT 1))`

// Unclassified is the error class of dead letters stored without one
// (buried before migration 0003).
const Unclassified = errclass.Unclassified

// For validates schema and table and returns the statements on that table.
func For(schema, table string) (Queries, error) {
	t, err := pgutil.NewTable(schema, table)
	if err != nil {
		return Queries{}, err
	}
	return New(t), nil
}

// New returns the statements on table t.
func New(t pgutil.Table) Queries {
	table, dead, lease, relays, audit := t.String(), t.Ident("_dead"), t.Ident("_lease"), t.Ident("_relays"), t.Ident("_audit")
	groups := t.Ident("_dead_groups")
	// live is true for a lease row whose owner is a live worker.
	live := `EXISTS (SELECT 1 FROM ` + relays + ` AS w WHERE w.owner = l.owner AND w.expires_at > now())`
	// claimable is true for the rows at ctids $1 that this transaction
	// can lock. The locked ctids come back as an array, so that the
	// delete reads them in one TID scan; as a subquery (ctid IN ...) they
	// were deduplicated by a hash aggregate and joined to a TID scan per
	// row. (A join on the seqs as well lets the planner pick a full index
	// scan when its statistics say the table is small.)
	// where is the dead-letter filter on this table.
	where := fmt.Sprintf(deadWhere, dead)
	claimable := `ctid = ANY(ARRAY(SELECT x.ctid FROM ` + table + ` AS x WHERE x.ctid = ANY($1::tid[]) FOR UPDATE SKIP LOCKED))`
	// gens is true while partitions $2 have gens $3.
	gens := `NOT EXISTS (SELECT 1 FROM unnest($2::int4[], $3::int8[]) AS g(part, gen) JOIN ` + lease + ` AS l ON l.part = g.part WHERE l.gen <> g.gen)`
	q := Queries{
		Table:  table,
		Dead:   dead,
		Lease:  lease,
		Relays: relays,

		Insert: `INSERT INTO ` + table + ` (id, destination, key, payload, headers)
SELECT m.id, m.destination, m.key, m.payload, m.headers::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[])
     WITH ORDINALITY AS m(id, destination, key, payload, headers, n)
ORDER BY m.n`,
		Notify: `SELECT pg_notify($1, '')`,
		Exists: `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL AND to_regclass($3) IS NOT NULL`,
		Stats: `SELECT count(*),
  extract(epoch FROM clock_timestamp() - min(created_at))::float8,
  count(*) FILTER (WHERE available_at > now() AND available_at < 'infinity'),
  count(*) FILTER (WHERE available_at = 'infinity'),
  count(*) FILTER (WHERE available_at > now() AND strpos(last_error, $1) > 0),
  (SELECT extract(epoch FROM clock_timestamp() - min(o.available_at))::float8 FROM ` + table + ` AS o
   WHERE o.available_at <= now()
     AND NOT EXISTS (SELECT 1 FROM ` + table + ` AS h WHERE h.key = o.key AND h.available_at > now())),
  (SELECT coalesce(sum(n), 0)::int8 FROM ` + groups + `)
FROM ` + table,
		Owners: `SELECT part, owner, token FROM ` + lease + ` WHERE part = ANY($1::int4[]) ORDER BY part`,
		Vacuum: `VACUUM ` + table,
		SequenceState: `SELECT s.oid::regclass::text, q.seqcache, coalesce(pg_sequence_last_value(s.oid), 0),
       greatest((SELECT max(seq) FROM ` + table + `), (SELECT max(seq) FROM ` + dead + `), 0)
FROM (SELECT pg_get_serial_sequence($1, 'seq')::regclass::oid AS oid) AS s
JOIN pg_sequence AS q ON q.seqrelid = s.oid`,
		Writable: `SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'`,
		Waiting: `SELECT coalesce(array_agg(DISTINCT key) FILTER (WHERE key IS NOT NULL), '{}'), coalesce(bool_or(key IS NULL), false)
FROM ` + table + ` WHERE destination = $1 AND available_at > now() AND available_at < 'infinity'`,
		RetryNow: `WITH due AS (
  UPDATE ` + table + ` SET available_at = now()
  WHERE seq IN (SELECT seq FROM ` + table + `
                WHERE destination = $1 AND available_at > now() AND available_at < 'infinity'
                  AND (key = ANY($2) OR (key IS NULL AND $3))
                FOR UPDATE SKIP LOCKED)
  RETURNING 1)
SELECT count(*) FROM due`,

		// Workers $1 (uuid[]) are alive for $2 more microseconds.
		Join: `INSERT INTO ` + relays + ` (owner, expires_at)
SELECT o, now() + $2 * interval '1 microsecond' FROM unnest($1::uuid[]) AS o
ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at`,
		// Workers $1 that did not leave are alive for $2 more microseconds.
		Beat: `UPDATE ` + relays + ` SET expires_at = now() + $2 * interval '1 microsecond' WHERE owner = ANY($1::uuid[])`,
		// The number of live workers, and the partitions worker $1 owns
		// (part, token, gen). Workers dead for an hour are forgotten.
		Live: `WITH gone AS (DELETE FROM ` + relays + ` WHERE expires_at < now() - interval '1 hour')
SELECT (SELECT count(*) FROM ` + relays + ` WHERE expires_at > now())::int,
       coalesce((SELECT array_agg(part ORDER BY part) FROM ` + lease + ` WHERE owner = $1), '{}'),
       coalesce((SELECT array_agg(token ORDER BY part) FROM ` + lease + ` WHERE owner = $1), '{}'),
       coalesce((SELECT array_agg(gen ORDER BY part) FROM ` + lease + ` WHERE owner = $1), '{}')`,
		// Worker $1 takes up to $2 partitions that nobody owns or whose
		// owner is dead, skipping those a batch or a dead-letter
		// operation holds, and bumps their token. It returns the previous
		// owner too (NULL: nobody), for the log.
		Take: `UPDATE ` + lease + ` AS t SET owner = $1, token = t.token + 1
FROM (SELECT part, owner FROM ` + lease + ` AS l WHERE l.owner IS NULL OR NOT ` + live + `
      ORDER BY part LIMIT $2 FOR UPDATE SKIP LOCKED) AS f
WHERE t.part = f.part
RETURNING t.part, t.token, t.gen, f.owner`,
		// Worker $1 gives up partitions $2, skipping those a dead-letter
		// operation holds (LockPartitions), and returns the ones it gave
		// up. It never waits: an operator's transaction left open must not
		// stop the worker, which keeps (and serves) what it could not give
		// up and tries again at its next rebalance.
		Release: `UPDATE ` + lease + ` AS t SET owner = NULL
FROM (SELECT part FROM ` + lease + ` WHERE owner = $1 AND part = ANY($2::int4[])
      ORDER BY part FOR NO KEY UPDATE SKIP LOCKED) AS l
WHERE t.part = l.part
RETURNING t.part`,
		// Worker $1 gives up its partitions and leaves, without waiting
		// for a dead-letter operation (see Release): a partition such an
		// operation holds stays in its name, and with its row gone the
		// others take it (Take) once the operation ended.
		Leave: `WITH r AS (UPDATE ` + lease + ` AS t SET owner = NULL
  FROM (SELECT part FROM ` + lease + ` WHERE owner = $1 ORDER BY part FOR NO KEY UPDATE SKIP LOCKED) AS l
  WHERE t.part = l.part)
DELETE FROM ` + relays + ` WHERE owner = $1`,
		// A batch's fence: the partitions worker $1 owns (part, token,
		// gen), locked until the batch ends, so that a takeover (Take, FOR
		// UPDATE) cannot change them meanwhile. FOR KEY SHARE does not
		// conflict with the gen bump of a dead-letter operation
		// (LockPartitions), which an operator may keep open: the claim
		// checks the gens instead.
		Hold: `SELECT part, token, gen FROM ` + lease + ` WHERE owner = $1 ORDER BY part FOR KEY SHARE`,
		// The batch locks the outbox before its sequence (Top), in the
		// order DROP TABLE takes them, so that the two never deadlock.
		Lock: `LOCK TABLE ` + table + ` IN ROW SHARE MODE`,
		// The outbox's identity sequence, as an oid.
		Sequence: `SELECT pg_get_serial_sequence($1, 'seq')::regclass::oid`,
		// The last seq handed out by sequence $1 (0 for none), the file
		// node of table $2 (TRUNCATE, VACUUM FULL and CLUSTER give it a new
		// one), the sequence's CACHE and its file node (a restart, by
		// ALTER SEQUENCE or TRUNCATE ... RESTART IDENTITY, gives it a new
		// one; setval does not).
		Top: `SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0), pg_relation_filenode($2::regclass)::int8,
       (SELECT seqcache FROM pg_sequence WHERE seqrelid = $1::oid), pg_relation_filenode($1::oid::regclass)::int8`,
		// The other transactions that may insert into table $1: those that
		// hold its RowExclusiveLock (taken before a row's seq is drawn),
		// by virtual transaction id; and whether none of the transactions
		// in $2 is still running (NULL: none to check). A prepared
		// transaction (PREPARE TRANSACTION) holds its locks without a
		// session, with a NULL pid: it counts until COMMIT or ROLLBACK
		// PREPARED, hence IS DISTINCT FROM.
		Writers: `SELECT ARRAY(SELECT virtualtransaction FROM pg_locks
              WHERE locktype = 'relation' AND relation = $1::regclass AND mode = 'RowExclusiveLock'
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND pid IS DISTINCT FROM pg_backend_pid()),
       CASE WHEN $2::text[] IS NULL THEN true
            ELSE NOT EXISTS (SELECT 1 FROM pg_locks WHERE virtualtransaction = ANY($2)) END`,
		// Up to $1 rows (partition, seq, ctid, order id, wait) from
		// partitions $2 (-1: unkeyed rows) in that order, each in seq order
		// from seq $4[i] on and, behind it from $3[i] on, the due rows whose
		// order id is not in $6 (the rows of transactions that committed
		// after the worker's cursor passed their seqs); with the
		// microseconds until they are due (0: due, -1: parked); order ids
		// per key and destination unless $5 (see orderOf, held and
		// scanned). The nested loop stops reading partitions once it has
		// $1 rows. The conditions and the order are those of the
		// (partition, seq) index and of no other: a plan cached while the
		// table was empty would otherwise scan the primary key and filter
		// (the relay also turns off sequential scans).
		Scan: `SELECT r.part, r.seq, r.ctid, r.oid, r.wait
FROM unnest($2::int4[], $3::int8[], $4::int8[]) WITH ORDINALITY AS p(part, start, cursor, n)
CROSS JOIN LATERAL (
  SELECT p.part, o.seq, o.ctid, ` + fmt.Sprintf(orderOf, "$5::bool") + ` AS oid, ` + due + ` AS wait
  FROM ` + table + ` AS o ` + fmt.Sprintf(held, table) + `
  WHERE ` + oPartition + ` <= p.part AND (` + oPartition + `, o.seq) >= (p.part, p.start) AND ` + scanned + `
    AND ` + behind("p.cursor", "$5::bool", "$6::int8[]") + `
  ORDER BY ` + oPartition + `, o.seq LIMIT $1) AS r
LIMIT $1`,
		// Scan for a worker that owns every partition: up to $1 rows in seq
		// order from seq $3 on and, behind it from $2 on, the due rows whose
		// order id is not in $5, through the primary key, so that a batch
		// takes neighbouring rows (a partition's rows lie far apart). Same
		// columns as Scan; $4 is Scan's $5. No row is locked: the worker
		// shares no partition, not even the unkeyed rows' (-1), so the
		// claim locks them all.
		ScanAll: `SELECT ` + oPartition + `, o.seq, o.ctid, ` + fmt.Sprintf(orderOf, "$4::bool") + `, ` + due + `
FROM ` + table + ` AS o
WHERE o.seq >= $2 AND ` + behind("$3::int8", "$4::bool", "$5::int8[]") + `
ORDER BY o.seq LIMIT $1`,
		// The file nodes of table $2 and of sequence $1, as Top reads them,
		// sent after a scan: the scan keeps the table locked, so if it saw
		// a row of a new run of the sequence (after TRUNCATE ... RESTART
		// IDENTITY or ALTER SEQUENCE ... RESTART), this shows the new node.
		Nodes: `SELECT pg_relation_filenode($2::regclass)::int8, pg_relation_filenode($1::oid::regclass)::int8`,
		// Failed rows go back with their seq (their place in their key's
		// order), due after a delay in microseconds (negative: parked
		// until a replay or purge releases them).
		PutBack: `INSERT INTO ` + table + ` (seq, id, created_at, available_at, attempts, destination, payload, key, headers, last_error)
SELECT s, i, c, CASE WHEN d < 0 THEN 'infinity'::timestamptz ELSE clock_timestamp() + d * interval '1 microsecond' END,
       a, dst, p, k, h::jsonb, e
FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int8[], $5::int4[], $6::text[], $7::bytea[], $8::text[], $9::text[], $10::text[])
     AS u(s, i, c, d, a, dst, p, k, h, e)`,
		// Bury writes dead letters with their error classes ($10, see
		// internal/errclass).
		Bury: `INSERT INTO ` + dead + ` (seq, id, created_at, failed_at, attempts, destination, payload, key, headers, last_error, error_class)
SELECT s, i, c, clock_timestamp(), a, dst, p, k, h::jsonb, e, ec
FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int4[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::text[], $10::text[])
     AS u(s, i, c, a, dst, p, k, h, e, ec)`,
		// The followers of keys $1 on destinations $2 (NULL: every
		// destination) whose head became a dead letter wait
		// (ParkFollowers).
		Park: `UPDATE ` + table + ` AS o SET available_at = 'infinity'
WHERE ` + partition + ` IN (SELECT ` + fmt.Sprintf(partOf, "k") + ` FROM unnest($1::text[]) AS k)
  AND o.available_at <> 'infinity'
  AND EXISTS (SELECT 1 FROM unnest($1::text[], $2::text[]) AS u(k, d) WHERE u.k = o.key AND (u.d IS NULL OR u.d = o.destination))`,
		Delivered: `DELETE FROM ` + table + ` WHERE ` + partition + ` = $1 AND seq = ANY($2::int8[])`,
		// Rows at ctids $1 (from Scan) are locked, skipping those another
		// session holds, deleted and returned, unless the gens of
		// partitions $2 are no longer $3 (a dead-letter operation moved
		// rows of theirs since the batch's fence read them): then none is.
		// The relay checks the seqs: a ctid whose row was deleted since
		// the scan may hold another row.
		Claim: `DELETE FROM ` + table + ` WHERE ` + claimable + ` AND ` + gens + `
RETURNING seq, id, destination, key, payload, headers, attempts, created_at`,
		// ClaimParked is Claim that also leaves out the rows of keys with
		// a dead letter, on the same destination unless $4.
		ClaimParked: `DELETE FROM ` + table + ` AS o WHERE ` + claimable + ` AND ` + gens + `
  AND (o.key IS NULL OR NOT EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.key = o.key AND ($4 OR d.destination = o.destination)))
RETURNING seq, id, destination, key, payload, headers, attempts, created_at`,

		ListDead: `SELECT id, destination, coalesce(key, ''), payload, headers, attempts, last_error, created_at, failed_at,
       coalesce(error_class, '` + Unclassified + `')
FROM ` + dead + ` WHERE ` + where + ` ORDER BY seq LIMIT $9`,
		LockDead: `SELECT seq, key FROM ` + dead + ` WHERE ` + where + `
ORDER BY seq LIMIT $9 FOR UPDATE`,
		// The aggregate reads the (error_class, destination, seq) INCLUDE
		// (failed_at) index of migration 0003 alone (an index-only scan
		// while the visibility map is current), then one primary-key probe
		// per group for its sample.
		DeadGroups: `SELECT g.class, g.destination, g.n, g.first, g.last, d.id, d.last_error
FROM (SELECT error_class AS class, destination, count(*) AS n, min(failed_at) AS first, max(failed_at) AS last, min(seq) AS sample
      FROM ` + dead + ` WHERE ` + where + `
      GROUP BY error_class, destination) AS g
JOIN ` + dead + ` AS d ON d.seq = g.sample
ORDER BY g.n DESC, g.class, g.destination
LIMIT $9`,
		// The summary's rows (one per group: a few hundred at most), and per
		// group one probe of the (error_class, destination, seq) index for
		// the oldest as the sample; unclassified rows are under class ''.
		GroupSummary: `SELECT nullif(g.class, ''), g.destination, g.n, g.first_failed, g.last_failed, s.id, s.last_error
FROM ` + groups + ` AS g
CROSS JOIN LATERAL (
  (SELECT d.id, d.last_error FROM ` + dead + ` AS d WHERE d.error_class = g.class AND d.destination = g.destination ORDER BY d.seq LIMIT 1)
  UNION ALL
  (SELECT d.id, d.last_error FROM ` + dead + ` AS d WHERE g.class = '' AND d.error_class IS NULL AND d.destination = g.destination ORDER BY d.seq LIMIT 1)
  LIMIT 1) AS s
WHERE ($1::text IS NULL OR g.destination = $1)
  AND ($2::text IS NULL OR starts_with(g.destination, $2))
  AND ($3::text IS NULL OR g.class = $3 OR ($3 = '` + Unclassified + `' AND g.class = ''))
ORDER BY g.n DESC, nullif(g.class, ''), g.destination
LIMIT $4`,
		Parked:       `SELECT destination, count(*) FROM ` + table + ` WHERE available_at = 'infinity' GROUP BY destination ORDER BY destination`,
		DeadSince:    `SELECT destination, count(*) FROM ` + dead + ` WHERE failed_at >= $1 GROUP BY destination ORDER BY destination`,
		Unclassified: `SELECT seq, last_error FROM ` + dead + ` WHERE error_class IS NULL ORDER BY error_class, destination, seq LIMIT $1`,
		Classify: `UPDATE ` + dead + ` AS d SET error_class = u.c
FROM unnest($1::int8[], $2::text[]) AS u(s, c) WHERE d.seq = u.s AND d.error_class IS NULL`,
		// The lowest seq and its age and the highest seq (primary-key
		// edges), and the planner's estimate of the rows in table $1:
		// reltuples per page at the last vacuum or analyze times the pages
		// now (NULL: never analyzed).
		GaugeEdges: `SELECT lo.seq, extract(epoch FROM clock_timestamp() - lo.created_at)::float8,
       (SELECT seq FROM ` + table + ` ORDER BY seq DESC LIMIT 1),
       (SELECT CASE WHEN c.reltuples < 0 OR c.relpages = 0 THEN NULL
                    ELSE (c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::int8))::int8 END
        FROM pg_class AS c WHERE c.oid = $1::regclass),
       coalesce(pg_sequence_last_value(pg_get_serial_sequence($1::regclass::text, 'seq')::regclass), 0)
FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT seq, created_at FROM ` + table + ` ORDER BY seq LIMIT 1) AS lo ON true`,
		// The oldest $2 rows (primary-key order) by destination: count, age
		// of the oldest, how long the oldest due one has been due, and the
		// rows held: parked behind a dead letter, no route ($1 = NoRoute),
		// waiting for a retry or a sink.
		GaugeSample: `SELECT destination, count(*),
       extract(epoch FROM clock_timestamp() - min(created_at))::float8,
       extract(epoch FROM clock_timestamp() - min(available_at) FILTER (WHERE available_at <= now()))::float8,
       count(*) FILTER (WHERE available_at = 'infinity'),
       count(*) FILTER (WHERE available_at > now() AND available_at < 'infinity' AND strpos(last_error, $1) > 0),
       count(*) FILTER (WHERE available_at > now() AND available_at < 'infinity' AND coalesce(strpos(last_error, $1), 0) = 0)
FROM (SELECT destination, created_at, available_at, last_error FROM ` + table + ` ORDER BY seq LIMIT $2) AS s
GROUP BY destination ORDER BY destination`,
		// The planner's statistics of the destination column of table $2
		// in schema $1: its most common values and their frequencies.
		GaugeStats: `SELECT coalesce(most_common_vals::text::text[], '{}'), coalesce(most_common_freqs, '{}')
FROM pg_stats WHERE schemaname = $1 AND tablename = $2 AND attname = 'destination'`,
		// Per partition (-1: unkeyed rows): owner and token, and the head
		// (its lowest seq and its age), one edge of the (partition, seq)
		// index each.
		GaugePartitions: `SELECT l.part, l.owner, coalesce(l.token, 0), h.seq, extract(epoch FROM clock_timestamp() - h.created_at)::float8
FROM (SELECT part, owner, token FROM ` + lease + ` UNION ALL SELECT -1, NULL, NULL) AS l
LEFT JOIN LATERAL (SELECT o.seq, o.created_at FROM ` + table + ` AS o WHERE ` + oPartition + ` = l.part
                   ORDER BY ` + oPartition + `, o.seq LIMIT 1) AS h ON true
ORDER BY l.part`,
		ByKey: `SELECT seq, id, destination, attempts, created_at, available_at, coalesce(last_error, '')
FROM (SELECT * FROM ` + table + ` WHERE ` + partition + ` = ` + fmt.Sprintf(partOf, "$1::text") + `
      ORDER BY ` + partition + `, seq LIMIT $3) AS o
WHERE key = $1 ORDER BY seq LIMIT $2`,
		// The relay workers and when their liveness runs out.
		GaugeRelays: `SELECT owner, expires_at, expires_at > now() FROM ` + relays + ` ORDER BY owner`,
		Audit:       `INSERT INTO ` + audit + ` (actor, action, target, filter, rows, outcome) VALUES ($1, $2, $3, $4::jsonb, $5, $6)`,
		AuditLog: `SELECT id, at, actor, action, target, filter, rows, outcome FROM ` + audit + `
WHERE $1::int8 IS NULL OR id < $1 ORDER BY id DESC LIMIT $2`,
		LockPartitions: `UPDATE ` + lease + ` AS t SET gen = t.gen + 1
FROM (SELECT part FROM ` + lease + `
      WHERE $2 OR part IN (SELECT ` + fmt.Sprintf(partOf, "k") + ` FROM unnest($1::text[]) AS k)
      ORDER BY part FOR NO KEY UPDATE) AS l
WHERE t.part = l.part`,
		Replay: `WITH moved AS (
  DELETE FROM ` + dead + ` WHERE seq = ANY($1)
  RETURNING seq, id, created_at, destination, payload, key, headers, last_error)
INSERT INTO ` + table + ` (seq, id, created_at, available_at, attempts, destination, payload, key, headers, last_error)
SELECT seq, id, created_at, now(), 0, destination, payload, key, headers, last_error FROM moved`,
		Purge: `DELETE FROM ` + dead + ` WHERE seq = ANY($1)`,
		Unpark: `UPDATE ` + table + ` AS o SET available_at = now()
WHERE ` + partition + ` IN (SELECT ` + fmt.Sprintf(partOf, "k") + ` FROM unnest($1::text[]) AS k)
  AND o.key = ANY($1) AND o.available_at = 'infinity'
  AND NOT EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.key = o.key AND d.destination = o.destination)`,
	}
	return q
}

// DecodeHeaders decodes the headers column: a JSON object whose values
// Enqueue always writes as strings. A value of another JSON type (a row
// written by hand) is kept as its JSON text; a column that is not an object
// is an error. nil decodes to nil.
func DecodeHeaders(raw []byte) (map[string]string, error) {
	if raw == nil {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("headers %.64q: %w", raw, err)
	}
	if fields == nil {
		return nil, nil
	}
	h := make(map[string]string, len(fields))
	for k, v := range fields {
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		h[k] = s
	}
	return h, nil
}
