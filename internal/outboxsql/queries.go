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
	"hash/fnv"

	"github.com/idemq/idemq/internal/pgutil"
)

// Key locks. Everyone who claims or moves rows of an ordering key holds the
// transaction-scoped advisory lock (LockClass, hashtext(key)) first: a
// relay takes it with pg_try_advisory_xact_lock in its scan and skips keys
// it cannot get, Replay and Purge wait for it with pg_advisory_xact_lock,
// in hash order so that two of them never deadlock. The lock is a
// transaction-scoped one, so a process that dies releases it with its
// connection, and a transaction-mode pooler keeps working.
const (
	// tryLockKey is the relay's non-blocking key lock; $1 is LockClass.
	tryLockKey = `pg_try_advisory_xact_lock($1, hashtext(key))`
	// lockKeys takes the locks of the keys in $2 (text[]) in hash order;
	// $1 is LockClass.
	lockKeys = `SELECT pg_advisory_xact_lock($1, h)
FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest($2::text[]) AS k ORDER BY 1) AS l`
)

// Columns are the columns Enqueue writes, in the order of Insert's arrays
// and of a COPY.
var Columns = []string{"id", "destination", "key", "payload", "headers"}

// Queries are the statements on one outbox table.
type Queries struct {
	// Table is the outbox table, Dead its dead-letter table (quoted,
	// schema-qualified), for messages and for Exists' arguments.
	Table, Dead string
	// LockClass is the first key of the key locks: the table's own, so
	// that two outboxes never contend.
	LockClass int32

	// Insert writes rows from arrays ($1 ids, $2 destinations, $3 keys,
	// $4 payloads, $5 headers as JSON text), numbered in array order.
	Insert string
	// Notify wakes the relays listening on channel $1 at commit.
	Notify string
	// Exists reports whether the tables named $1 and $2 exist.
	Exists string
	// Stats counts pending rows, the age of the oldest, and dead letters.
	Stats string
	// Vacuum vacuums the outbox table (simple protocol, outside a tx).
	Vacuum string
	// RetryNow makes the rows of destination $1 that wait for a later
	// time due now, and counts them; rows parked behind a dead letter and
	// rows in a batch being published (locked) are left alone.
	RetryNow string

	// Scan, Claim, PutBack, Bury, Park and Bump are the relay's; see
	// their comments below and the relay package's claim.go. ClaimParked
	// is Claim for ParkFollowers: it also skips keys with a dead letter.
	Scan, Claim, ClaimParked, PutBack, Bury, Park, Bump string

	// ListDead lists dead letters by the DeadFilter parameters ($1-$6) up
	// to $7. LockDead locks them (seq, key) for Replay and Purge, LockKeys
	// takes their keys' locks, Replay moves the dead letters with seq in
	// $1 back, Purge deletes them, and Unpark releases the rows parked
	// behind keys in $1 that have no dead letter left.
	ListDead, LockDead, LockKeys, Replay, Purge, Unpark string
}

// deadWhere is the dead-letter filter: static SQL whose parameters are NULL
// when a filter field is unset ($1 ids, $2 destination, $3 destination
// prefix, $4 key, $5 failed before, $6 failed at or after).
const deadWhere = `($1::uuid[] IS NULL OR id = ANY($1))
  AND ($2::text IS NULL OR destination = $2)
  AND ($3::text IS NULL OR starts_with(destination, $3))
  AND ($4::text IS NULL OR key = $4)
  AND ($5::timestamptz IS NULL OR failed_at < $5)
  AND ($6::timestamptz IS NULL OR failed_at >= $6)`

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
	table, dead := t.String(), t.Ident("_dead")
	h := fnv.New32a()
	h.Write([]byte("idemq-outbox:" + t.Schema + "." + t.Name))
	q := Queries{
		Table:     table,
		Dead:      dead,
		LockClass: int32(h.Sum32()),

		Insert: `INSERT INTO ` + table + ` (id, destination, key, payload, headers)
SELECT m.id, m.destination, m.key, m.payload, m.headers::jsonb
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::text[])
     WITH ORDINALITY AS m(id, destination, key, payload, headers, n)
ORDER BY m.n`,
		Notify: `SELECT pg_notify($1, '')`,
		Exists: `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
		Stats: `SELECT (SELECT count(*) FROM ` + table + `),
  (SELECT extract(epoch FROM clock_timestamp() - min(created_at))::float8 FROM ` + table + `),
  (SELECT count(*) FROM ` + dead + `)`,
		Vacuum: `VACUUM ` + table,
		RetryNow: `WITH due AS (
  UPDATE ` + table + ` SET available_at = now()
  WHERE seq IN (SELECT seq FROM ` + table + `
                WHERE destination = $1 AND available_at > now() AND available_at < 'infinity'
                FOR UPDATE SKIP LOCKED)
  RETURNING 1)
SELECT count(*) FROM due`,

		// The first $2 due rows from seq $3 on, locked, each keyed row only
		// if its key's lock was free and the key falls into this worker's
		// share ($4 workers, this is number $5).
		Scan: `SELECT seq, key FROM ` + table + `
WHERE seq >= $3 AND CASE WHEN available_at > now() THEN false
                         WHEN key IS NULL THEN true
                         WHEN $4 > 1 AND mod(hashtext(key)::int8 + 2147483648, $4) <> $5 THEN false
                         ELSE ` + tryLockKey + ` END
ORDER BY seq LIMIT $2
FOR UPDATE SKIP LOCKED`,
		// Failed rows go back with their seq (their place in their key's
		// order), due after a delay in microseconds (negative: parked
		// until a replay or purge releases them).
		PutBack: `INSERT INTO ` + table + ` (seq, id, created_at, available_at, attempts, destination, payload, key, headers, last_error)
SELECT s, i, c, CASE WHEN d < 0 THEN 'infinity'::timestamptz ELSE clock_timestamp() + d * interval '1 microsecond' END,
       a, dst, p, k, h::jsonb, e
FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int8[], $5::int4[], $6::text[], $7::bytea[], $8::text[], $9::text[], $10::text[])
     AS u(s, i, c, d, a, dst, p, k, h, e)`,
		Bury: `INSERT INTO ` + dead + ` (seq, id, created_at, failed_at, attempts, destination, payload, key, headers, last_error)
SELECT s, i, c, clock_timestamp(), a, dst, p, k, h::jsonb, e
FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int4[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::text[])
     AS u(s, i, c, a, dst, p, k, h, e)`,
		// The followers of keys $1 whose head became a dead letter wait
		// (ParkFollowers).
		Park: `UPDATE ` + table + ` SET available_at = 'infinity' WHERE key = ANY($1) AND available_at <> 'infinity'`,
		// A locked key that yielded nothing has a head that is not due (or
		// is parked, $2 being ParkFollowers): move its followers behind the
		// head so that scans stop spending their window on them.
		Bump: `WITH h AS (
  SELECT k.key, CASE WHEN $2 AND EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.key = k.key) THEN 'infinity'::timestamptz
                     ELSE (SELECT x.available_at FROM ` + table + ` AS x WHERE x.key = k.key ORDER BY x.seq LIMIT 1) END AS until
  FROM unnest($1::text[]) AS k(key))
UPDATE ` + table + ` AS o SET available_at = h.until FROM h WHERE o.key = h.key AND o.available_at < h.until`,

		ListDead: `SELECT id, destination, coalesce(key, ''), payload, headers, attempts, last_error, created_at, failed_at
FROM ` + dead + ` WHERE ` + deadWhere + ` ORDER BY seq LIMIT $7`,
		LockDead: `SELECT seq, key FROM ` + dead + ` WHERE ` + deadWhere + `
ORDER BY seq LIMIT $7 FOR UPDATE`,
		LockKeys: lockKeys,
		Replay: `WITH moved AS (
  DELETE FROM ` + dead + ` WHERE seq = ANY($1)
  RETURNING seq, id, created_at, destination, payload, key, headers, last_error)
INSERT INTO ` + table + ` (seq, id, created_at, available_at, attempts, destination, payload, key, headers, last_error)
SELECT seq, id, created_at, now(), 0, destination, payload, key, headers, last_error FROM moved`,
		Purge: `DELETE FROM ` + dead + ` WHERE seq = ANY($1)`,
		Unpark: `UPDATE ` + table + ` AS o SET available_at = now()
WHERE o.key = ANY($1) AND o.available_at = 'infinity'
  AND NOT EXISTS (SELECT 1 FROM ` + dead + ` AS d WHERE d.key = o.key)`,
	}
	q.Claim = claim(table, "")
	q.ClaimParked = claim(table, `AND NOT EXISTS (SELECT 1 FROM `+dead+` AS d WHERE d.key = k.key)`)
	return q
}

// claim is the relay's claim. One index probe per locked key ($1 keys, $2
// their counts in the scan, $4 their first seq in the scan) finds its real
// head; the key qualifies if that head is the row the scan locked first for
// it (a head before the cursor, not due, or put back by a previous holder
// after the scan's snapshot has a lower seq) and passes the extra
// condition. Keys with more rows in the window take the rows that follow.
// $3 are the scan's unkeyed rows. Everything claimed is deleted and
// returned. ParkFollowers gets its own statement rather than a parameter:
// a boolean parameter guarding the extra EXISTS made the generic plan
// measurably slower even for unkeyed batches.
func claim(table, extra string) string {
	return `WITH k AS (
  SELECT key, n, first FROM unnest($1::text[], $2::int4[], $4::int8[]) AS k(key, n, first)
), heads AS (
  SELECT k.key, k.n, k.first FROM k
  WHERE (SELECT o.seq FROM ` + table + ` AS o WHERE o.key = k.key ORDER BY o.seq LIMIT 1) = k.first ` + extra + `
), keyed AS (
  SELECT first AS seq FROM heads
  UNION ALL
  SELECT r.seq FROM heads CROSS JOIN LATERAL (
    SELECT o.seq FROM ` + table + ` AS o WHERE o.key = heads.key AND o.seq > heads.first ORDER BY o.seq LIMIT heads.n - 1) AS r
)
DELETE FROM ` + table + ` WHERE seq = ANY(ARRAY(SELECT seq FROM keyed UNION ALL SELECT unnest($3::int8[])))
RETURNING seq, id, destination, key, payload, headers, attempts, created_at`
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
