package inboxsql

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Partitioning is inbox.Partitioning: the layout of the inbox table.
type Partitioning int

// The layouts, as package inbox names them.
const (
	Unpartitioned Partitioning = iota
	PartitionByArrival
	PartitionByKey
)

// PartitionsAhead is how many buckets past the current one exist: the
// newest a UUIDv7 key from a clock ahead is clamped to.
const PartitionsAhead = 2

// Bucket is the SQL expression of the bucket a record of key (an SQL
// expression: a parameter or a column) goes to in table, scope $1:
// under PartitionByKey the key's own time, clamped to the span of the
// partitions (Retention back to PartitionsAhead ahead); under
// PartitionByArrival the statement's time. Either way the bucket of a
// record the key already has in a bucket probed (bucket 0, the table from
// before partitioning; by arrival also the previous bucket) comes first,
// so that the insert meets that record and its conflict clause finds it.
func Bucket(table, key string, p Partitioning, interval, retention time.Duration) string {
	secs := strconv.FormatInt(int64(interval/time.Second), 10)
	now := `floor(extract(epoch FROM statement_timestamp()) / ` + secs + `)`
	probe := func(buckets, fallback string) string {
		return `coalesce((SELECT p.bucket FROM ` + table + ` p WHERE p.scope_id = $1 AND p.key_id = ` + key +
			` AND p.bucket IN (` + buckets + `) LIMIT 1), ` + fallback + `)`
	}
	if p == PartitionByKey {
		own := `(('x' || substr(replace(` + key + `::text, '-', ''), 1, 12))::bit(48)::bigint / (` + secs + ` * 1000))`
		oldest := `floor((extract(epoch FROM statement_timestamp()) - ` + strconv.FormatInt(int64(retention/time.Second), 10) + `) / ` + secs + `)`
		return probe("0", `least(greatest(`+own+`, `+oldest+`), `+now+` + `+strconv.Itoa(PartitionsAhead)+`)::int`)
	}
	return probe("0, "+now+"::int - 1", now+"::int")
}

// PartitionInsert rewrites sql, a statement that inserts a record, for the
// partitioned table: it names the record's bucket (Bucket of key, placed
// after valuesFrom, the start of its VALUES or SELECT list), and its
// conflicts are on the primary key, which includes the bucket.
func PartitionInsert(sql, valuesFrom, key, table string, p Partitioning, interval, retention time.Duration) string {
	out := strings.Replace(sql, "(expires_at, key_id, scope_id,", "(bucket, expires_at, key_id, scope_id,", 1)
	out = strings.Replace(out, valuesFrom, valuesFrom+Bucket(table, key, p, interval, retention)+", ", 1)
	out = strings.ReplaceAll(out, "ON CONFLICT (scope_id, key_id)", "ON CONFLICT (scope_id, key_id, bucket)")
	if out == sql || !strings.Contains(out, "(bucket,") {
		panic("inbox: partitioned statement not rewritten: " + sql)
	}
	return out
}

// partitionQueries rewrites the claim protocol's inserts for the
// partitioned table, and makes reads find a key's newest record (a key
// may have one in a bucket past retention until GC drops it).
func partitionQueries(q *queries, table string, opts Options) {
	insert := func(sql, valuesFrom, key string) string {
		return PartitionInsert(sql, valuesFrom, key, table, opts.Partitioning, opts.PartitionInterval, opts.Retention)
	}
	q.claim = insert(q.claim, "VALUES (", "$2::uuid")
	q.recordFailure = insert(q.recordFailure, "VALUES (", "$2::uuid")
	q.deadLetter = insert(q.deadLetter, "VALUES (", "$2::uuid")
	q.claimBatch = insert(q.claimBatch, "SELECT ", "i.key_id")
	q.get += ` ORDER BY r.bucket DESC LIMIT 1`
}

// checkPartitionKey refuses a key that PartitionByKey cannot place.
func (s *Store) checkPartitionKey(id uuid.UUID, text *string) error {
	if s.opts.Partitioning != PartitionByKey || (text == nil && id.Version() == 7) {
		return nil
	}
	name := id.String()
	if text != nil {
		name = strconv.Quote(*text)
	}
	return fmt.Errorf("%w: the inbox is partitioned by key and %s is not a UUIDv7", ErrInvalidKey, name)
}

// nearBoundary reports whether now is within BoundaryGrace of a bucket
// boundary under PartitionByArrival.
func (s *Store) nearBoundary() bool {
	if s.opts.Partitioning != PartitionByArrival {
		return false
	}
	in := time.Duration(time.Now().UnixNano() % int64(s.opts.PartitionInterval))
	return in < s.opts.BoundaryGrace || s.opts.PartitionInterval-in < s.opts.BoundaryGrace
}

// boundaryLockSQL takes the advisory lock of (scope, key) until the
// transaction ends. It is its own statement, before the claim: the claim's
// snapshot is then taken after the lock was granted, so it sees the
// record of a claim that held the lock and committed.
const boundaryLockSQL = `SELECT pg_advisory_xact_lock($1::int, $2::int)`

func lockKey(id uuid.UUID) int32 { return int32(binary.BigEndian.Uint32(id[12:])) }

// boundaryLock takes the advisory lock of each key in tx when the claim
// falls near a bucket boundary, in lock order so that batches cannot
// deadlock.
func (s *Store) boundaryLock(ctx context.Context, tx pgx.Tx, scopeID int32, ids ...uuid.UUID) error {
	if !s.nearBoundary() {
		return nil
	}
	keys := make([]int32, len(ids))
	for i, id := range ids {
		keys[i] = lockKey(id)
	}
	slices.Sort(keys)
	for _, k := range slices.Compact(keys) {
		if _, err := tx.Exec(ctx, boundaryLockSQL, scopeID, k); err != nil {
			return fmt.Errorf("inbox: boundary lock: %w", err)
		}
	}
	return nil
}

// queueBoundaryLock is boundaryLock for a claim that travels in b.
func (s *Store) queueBoundaryLock(b *pgx.Batch, scopeID int32, id uuid.UUID) {
	if s.nearBoundary() {
		b.Queue(boundaryLockSQL, scopeID, lockKey(id))
	}
}
