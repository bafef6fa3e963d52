package inboxsql

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// bucketSQL is the SQL expression of the bucket a record of key (an SQL
// expression: a parameter or a column) goes to in table, scope $1:
// under PartitionByKey the key's own time, which never changes, so every
// copy of a key meets the same record; under PartitionByArrival the
// statement's time. Either way the bucket of a record the key already has
// in a bucket probed (bucket 0, the table from before partitioning; by
// arrival also the previous bucket) comes first, so that the insert meets
// that record and its conflict clause finds it.
func bucketSQL(table, key string, p Partitioning, interval time.Duration) string {
	secs := strconv.FormatInt(int64(interval/time.Second), 10)
	now := `floor(extract(epoch FROM statement_timestamp()) / ` + secs + `)::int`
	probe := func(buckets, fallback string) string {
		return `coalesce((SELECT p.bucket FROM ` + table + ` p WHERE p.scope_id = $1 AND p.key_id = ` + key +
			` AND p.bucket IN (` + buckets + `) LIMIT 1), ` + fallback + `)`
	}
	if p == PartitionByKey {
		return probe("0", `(('x' || substr(replace(`+key+`::text, '-', ''), 1, 12))::bit(48)::bigint / (`+secs+` * 1000))::int`)
	}
	return probe("0, "+now+" - 1", now)
}

// partitionInsert rewrites sql, a statement that inserts a record, for
// the partitioned table: it names the record's bucket (Bucket of key,
// placed after valuesFrom, the start of its VALUES or SELECT list), and
// its conflicts are on the primary key, which includes the bucket.
func partitionInsert(sql, valuesFrom, key, table string, p Partitioning, interval time.Duration) string {
	out := strings.Replace(sql, "(expires_at, key_id, scope_id,", "(bucket, expires_at, key_id, scope_id,", 1)
	out = strings.Replace(out, valuesFrom, valuesFrom+bucketSQL(table, key, p, interval)+", ", 1)
	out = strings.ReplaceAll(out, "ON CONFLICT (scope_id, key_id)", "ON CONFLICT (scope_id, key_id, bucket)")
	if out == sql || !strings.Contains(out, "(bucket,") {
		panic("inbox: partitioned statement not rewritten: " + sql)
	}
	return out
}

// partitionQueries rewrites the statements that insert records for the
// partitioned table, makes reads find a key's newest record (a key may
// have one in a bucket past retention until GC drops it), and GC deletes
// no rows: it drops partitions (dropExpired).
func partitionQueries(q *queries, table string, cfg Config) {
	insert := func(sql, valuesFrom, key string) string {
		return partitionInsert(sql, valuesFrom, key, table, cfg.Partitioning, cfg.PartitionInterval)
	}
	q.claim = insert(q.claim, "VALUES (", "$2::uuid")
	q.recordFailure = insert(q.recordFailure, "VALUES (", "$2::uuid")
	q.deadLetter = insert(q.deadLetter, "VALUES (", "$2::uuid")
	q.claimBatch = insert(q.claimBatch, "SELECT ", "i.key_id")
	q.acquire = insert(q.acquire, "SELECT ", "$2::uuid")
	q.acquireAsync = insert(q.acquireAsync, "SELECT ", "$2::uuid")
	q.get += ` ORDER BY r.bucket DESC LIMIT 1`
	q.gc = `SELECT $1::int WHERE false`
	q.boundaryLock = boundaryLock(cfg)
}

// checkPartitionKey refuses a key that PartitionByKey cannot place: one
// that is not a UUIDv7, or whose time lies outside the span of the
// partitions, Retention back to PartitionsAhead buckets ahead, by this
// process's clock. Its bucket never moves, so an accepted key is unique
// however the clocks differ; near the edges of the span, where this
// clock and the database's may disagree, a claim finds no partition and
// fails with a retryable error (see noPartition) until they agree.
func (s *Store) checkPartitionKey(id uuid.UUID, text *string) error {
	if text != nil || id.Version() != 7 {
		name := id.String()
		if text != nil {
			name = strconv.Quote(*text)
		}
		return fmt.Errorf("%w: the inbox is partitioned by key and %s is not a UUIDv7", ErrInvalidKey, name)
	}
	sec, nsec := id.Time().UnixTime()
	at, now := time.Unix(sec, nsec), time.Now()
	switch {
	case s.bucketAt(at) > s.bucketAt(now)+PartitionsAhead:
		return fmt.Errorf("%w: the inbox is partitioned by key and %s carries the time %s, more than %d partitions of %v ahead of now: a clock ahead stamped it",
			ErrInvalidKey, id, at.UTC().Format(time.RFC3339), PartitionsAhead, s.cfg.PartitionInterval)
	case s.bucketAt(at) < s.bucketAt(now.Add(-s.cfg.Retention)):
		return fmt.Errorf("%w: the inbox is partitioned by key and %s carries the time %s, older than the Retention of %v: its partition is gone",
			ErrInvalidKey, id, at.UTC().Format(time.RFC3339), s.cfg.Retention)
	}
	return nil
}

// ErrNoPartition reports a claim whose bucket has no partition: partition
// maintenance (GC, or the maintenance service) has not run for longer
// than the partitions made ahead last, or the clocks of this process and
// the database disagree at the edge of PartitionByKey's span. It is
// retryable: the message waits, nothing is recorded.
var ErrNoPartition = errors.New("inbox: no partition for the record's bucket: run GC (or the maintenance service) at least once per PartitionInterval")

// noPartition marks err with ErrNoPartition when Postgres found no
// partition for a row (23514 on a partitioned table).
func noPartition(err error) error {
	if pg := (*pgconn.PgError)(nil); errors.As(err, &pg) && pg.Code == "23514" && strings.HasPrefix(pg.Message, "no partition of relation") {
		return fmt.Errorf("%w: %w", ErrNoPartition, err)
	}
	return err
}

// boundaryLock is the statement that takes the advisory locks of the keys
// $2 (int4[], sorted, so that batches cannot deadlock) in scope $1 until
// the transaction ends, when the database's clock is within BoundaryGrace
// of a bucket boundary under PartitionByArrival: the decision and the
// bucket (statement_timestamp()) read the same clock, whatever this
// process's says. It runs as its own statement before the claim, so the
// claim's snapshot is taken after the lock was granted and sees the
// record of a claim that held it and committed. Empty for other layouts.
func boundaryLock(cfg Config) string {
	if cfg.Partitioning != PartitionByArrival {
		return ""
	}
	secs := strconv.FormatInt(int64(cfg.PartitionInterval/time.Second), 10)
	grace := strconv.FormatFloat(cfg.BoundaryGrace.Seconds(), 'f', -1, 64)
	return `SELECT pg_advisory_xact_lock($1::int, k) FROM (SELECT DISTINCT k FROM unnest($2::int4[]) AS k ORDER BY k) keys
WHERE (SELECT m < ` + grace + ` OR ` + secs + ` - m < ` + grace + `
	FROM (SELECT mod(extract(epoch FROM statement_timestamp())::numeric, ` + secs + `) AS m) t)`
}

func lockKey(id uuid.UUID) int32 { return int32(binary.BigEndian.Uint32(id[12:])) }

// lockKeys are the advisory lock keys of ids.
func lockKeys(ids ...uuid.UUID) []int32 {
	keys := make([]int32, len(ids))
	for i, id := range ids {
		keys[i] = lockKey(id)
	}
	return keys
}

// partitionName is bucket's partition of the table.
func (s *Store) partitionName(bucket int64) string {
	return pgx.Identifier{s.table.Schema, s.table.Name + "_p" + strconv.FormatInt(bucket, 10)}.Sanitize()
}

// partitionLockTimeout bounds how long partition maintenance waits for a
// lock on the live table; it gives up and tries again at the next GC.
const partitionLockTimeout = "2s"

// EnsurePartitions creates the partitions of a partitioned inbox that are
// due: under PartitionByArrival the current bucket and PartitionsAhead
// more, under PartitionByKey every bucket from Retention ago to
// PartitionsAhead ahead. Each is created as a plain table with a CHECK
// constraint and attached, which takes only SHARE UPDATE EXCLUSIVE on the
// inbox (claims go on) and skips the validation scan. Migrate and GC call
// it. It first refuses a table whose layout is not the Config's (see
// checkLayout); on an unpartitioned inbox it does nothing else.
func (s *Store) EnsurePartitions(ctx context.Context) error {
	if err := s.checkLayout(ctx); err != nil || s.cfg.Partitioning == Unpartitioned {
		return err
	}
	now, existing, err := s.partitions(ctx)
	if err != nil {
		return err
	}
	cur := s.bucketAt(now)
	from := cur - 1
	if s.cfg.Partitioning == PartitionByKey {
		// Older keys are past Retention; their bucket is one GC drops.
		from = s.bucketAt(now.Add(-s.cfg.Retention))
	}
	for b := from; b <= cur+PartitionsAhead; b++ {
		if b < 1 || slices.Contains(existing, b) {
			continue
		}
		if err := s.createPartition(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) bucketAt(t time.Time) int64 {
	return t.Unix() / int64(s.cfg.PartitionInterval/time.Second)
}

// partitions returns the database's clock and the buckets of the
// partitions that exist (bucket 0, the table from before partitioning,
// as 0).
func (s *Store) partitions(ctx context.Context) (time.Time, []int64, error) {
	var now time.Time
	var names []string
	err := s.db.QueryRow(ctx, `
SELECT now(), coalesce(array_agg(c.relname::text), '{}') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = to_regclass($1)`, s.table.String()).Scan(&now, &names)
	if err != nil {
		return now, nil, fmt.Errorf("inbox: list partitions: %w", NotMigrated(err))
	}
	var buckets []int64
	for _, n := range names {
		if b, err := strconv.ParseInt(strings.TrimPrefix(n, s.table.Name+"_p"), 10, 64); err == nil {
			buckets = append(buckets, b)
		}
	}
	return now, buckets, nil
}

func (s *Store) createPartition(ctx context.Context, b int64) error {
	name := s.partitionName(b)
	lo, hi := strconv.FormatInt(b, 10), strconv.FormatInt(b+1, 10)
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		for _, stmt := range []string{
			`SET LOCAL lock_timeout = '` + partitionLockTimeout + `'`,
			`CREATE TABLE IF NOT EXISTS ` + name + ` (LIKE ` + s.table.String() + ` INCLUDING DEFAULTS,
	CONSTRAINT idemq_bucket CHECK (bucket >= ` + lo + ` AND bucket < ` + hi + `))`,
			// Another process may have attached it meanwhile.
			`DO $$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = '` + name + `'::regclass) THEN
		ALTER TABLE ` + s.table.String() + ` ATTACH PARTITION ` + name + ` FOR VALUES FROM (` + lo + `) TO (` + hi + `);
	END IF;
END $$`,
		} {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("inbox: create partition %s: %w", name, err)
			}
		}
		return nil
	})
}

// dropExpired drops the partitions whose records have all expired: under
// PartitionByArrival a bucket once the one after it has ended, under
// PartitionByKey a bucket whose end is Retention in the past, and bucket
// 0 (the table from before partitioning) once it holds no unexpired
// record and no live lease. A partition is detached CONCURRENTLY, which
// never blocks claims, then dropped. It returns how many it dropped.
func (s *Store) dropExpired(ctx context.Context) (int64, error) {
	now, existing, err := s.partitions(ctx)
	if err != nil {
		return 0, err
	}
	cur := s.bucketAt(now)
	var dropped int64
	for _, b := range existing {
		expired := b < cur-1
		if s.cfg.Partitioning == PartitionByKey {
			expired = b > 0 && b+1 <= s.bucketAt(now.Add(-s.cfg.Retention))
		}
		if b == 0 {
			err := s.db.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+s.partitionName(0)+
				` WHERE expires_at >= now() OR (status = `+strconv.Itoa(int(InProgress))+` AND lease_until > now()))`).Scan(&expired)
			if err != nil {
				return dropped, fmt.Errorf("inbox: gc: %w", err)
			}
		}
		if !expired {
			continue
		}
		name := s.partitionName(b)
		if _, err := s.db.Exec(ctx, `ALTER TABLE `+s.table.String()+` DETACH PARTITION `+name+` CONCURRENTLY`); err != nil {
			return dropped, fmt.Errorf("inbox: gc: detach %s: %w", name, err)
		}
		if _, err := s.db.Exec(ctx, `DROP TABLE `+name); err != nil {
			return dropped, fmt.Errorf("inbox: gc: drop %s: %w", name, err)
		}
		dropped++
	}
	return dropped, nil
}

// gcPartitions is GC's step on a partitioned inbox: drop what expired,
// create what is due.
func (s *Store) gcPartitions(ctx context.Context) error {
	if s.cfg.Partitioning == Unpartitioned {
		return nil
	}
	if _, err := s.dropExpired(ctx); err != nil {
		return err
	}
	return s.EnsurePartitions(ctx)
}

// PrepareLivePartitioning readies a live, unpartitioned inbox table for
// the migration to a partitioned mode, without blocking its writers: it
// adds the bucket column (a constant default: no rewrite), builds the
// index that becomes the old table's primary key with CREATE UNIQUE INDEX
// CONCURRENTLY, and proves with a NOT VALID check validated afterwards
// (SHARE UPDATE EXCLUSIVE) that every row is bucket 0. The migration then
// only renames and attaches, so its locks are short whatever the table's
// size. It must run outside a transaction (db a pool or a connection) and
// is idempotent; on a table already partitioned it does nothing.
func (s *Store) PrepareLivePartitioning(ctx context.Context) error {
	var partitioned, exists bool
	err := s.db.QueryRow(ctx, `SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($1)), false), to_regclass($1) IS NOT NULL`,
		s.table.String()).Scan(&partitioned, &exists)
	if err != nil {
		return fmt.Errorf("inbox: prepare partitioning: %w", err)
	}
	if partitioned || !exists {
		return nil
	}
	t := s.table.String()
	index := pgx.Identifier{s.table.Name + "_bucket_key"}.Sanitize()
	for _, stmt := range []string{
		`ALTER TABLE ` + t + ` ADD COLUMN IF NOT EXISTS bucket int NOT NULL DEFAULT 0`,
		`CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS ` + index + ` ON ` + t + ` (scope_id, key_id, bucket)`,
		`DO $$ BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '` + t + `'::regclass AND conname = 'idemq_bucket_0') THEN
		ALTER TABLE ` + t + ` ADD CONSTRAINT idemq_bucket_0 CHECK (bucket = 0) NOT VALID;
	END IF;
END $$`,
		`ALTER TABLE ` + t + ` VALIDATE CONSTRAINT idemq_bucket_0`,
	} {
		if _, err := s.db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("inbox: prepare partitioning: %w", err)
		}
	}
	return nil
}
