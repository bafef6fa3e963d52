package inbox

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/inboxsql"
)

// Partitioning is the layout of the inbox table (Config.Partitioning).
type Partitioning int

const (
	// Unpartitioned is one plain table, its records deleted by GC in
	// batches. The default.
	Unpartitioned Partitioning = iota
	// PartitionByArrival partitions records by their arrival time, in
	// buckets of Config.PartitionInterval, for keys of any form (Kafka
	// offsets, webhook-ids, HTTP keys). A claim probes the current and
	// the previous bucket; GC drops a bucket once the next one has ended,
	// so a record lives between one and two intervals, and the interval
	// is at least Retention. Two copies of one key claimed on either side
	// of a bucket boundary while both are uncommitted would each find
	// nothing: within Config.BoundaryGrace of a boundary, a claim first
	// takes a transaction-scoped advisory lock on its key, so the second
	// waits for the first and then sees its record. Claim transactions
	// must commit within BoundaryGrace and run at READ COMMITTED.
	// RecordFailure and Acquire, statements in transactions of their own,
	// take no lock: their window is one statement's duration.
	PartitionByArrival
	// PartitionByKey partitions records by the time in their key, for
	// inboxes whose keys are all UUIDv7 (idemq's outbox ids are): the
	// bucket is a function of the key, so uniqueness stays exact and
	// global and a claim probes one partition. A key that is not a
	// UUIDv7 is refused (ErrInvalidKey). GC drops a bucket once its end
	// is Retention in the past: a key is deduplicated for Retention after
	// the time it carries. A key older than that is stored in the oldest
	// bucket (it is past the window: a later copy may be applied again),
	// one from a clock more than PartitionsAhead buckets ahead in the
	// newest.
	PartitionByKey
)

func (p Partitioning) String() string {
	switch p {
	case Unpartitioned:
		return "unpartitioned"
	case PartitionByArrival:
		return "by arrival"
	case PartitionByKey:
		return "by key"
	}
	return "Partitioning(" + strconv.Itoa(int(p)) + ")"
}

// The partitioning defaults of [Config].
const (
	// PartitionIntervalByKeyDefault is Config.PartitionInterval under
	// PartitionByKey; under PartitionByArrival it defaults to Retention.
	PartitionIntervalByKeyDefault = 24 * time.Hour
	BoundaryGraceDefault          = time.Minute
	// PartitionsAhead is how many buckets past the current one
	// EnsurePartitions creates.
	PartitionsAhead = inboxsql.PartitionsAhead
)

func (c Config) partitionDefaults() Config {
	if c.PartitionInterval == 0 {
		switch c.Partitioning {
		case PartitionByArrival:
			c.PartitionInterval = c.Retention
		case PartitionByKey:
			c.PartitionInterval = PartitionIntervalByKeyDefault
		}
	}
	if c.BoundaryGrace == 0 {
		c.BoundaryGrace = BoundaryGraceDefault
	}
	return c
}

func (c Config) validatePartitioning() error {
	switch {
	case c.Partitioning < Unpartitioned || c.Partitioning > PartitionByKey:
		return idemq.NewConfigError("inbox", "Partitioning", "%d is not a Partitioning", int(c.Partitioning))
	case c.Partitioning == Unpartitioned:
		return nil
	case c.PartitionInterval < time.Second || c.PartitionInterval%time.Second != 0:
		return idemq.NewConfigError("inbox", "PartitionInterval", "%v is not a whole number of seconds", c.PartitionInterval)
	case c.Partitioning == PartitionByArrival && c.PartitionInterval < c.Retention:
		return idemq.NewConfigError("inbox", "PartitionInterval", "%v is below Retention (%v): claims probe two buckets, which must span Retention", c.PartitionInterval, c.Retention)
	case c.Partitioning == PartitionByArrival && (c.BoundaryGrace < 0 || 2*c.BoundaryGrace >= c.PartitionInterval):
		return idemq.NewConfigError("inbox", "BoundaryGrace", "%v: want a positive duration under half of PartitionInterval", c.BoundaryGrace)
	}
	return nil
}

//go:embed partitioned/*.sql
var partitionedMigrations embed.FS

// migrationFiles is the migrations directory, with the partitioned mode's
// own migration on top when the Store is partitioned: a partitioned inbox
// is one version ahead, and Down to the version before undoes it.
func (s *Store) migrationFiles() fs.FS {
	if s.cfg.Partitioning == Unpartitioned {
		return migrations
	}
	return overlay{migrations, partitionedMigrations}
}

// overlay reads "migrations" from a, adding b's "partitioned" files.
type overlay struct{ a, b embed.FS }

func (o overlay) Open(name string) (fs.File, error) {
	if f, err := o.a.Open(name); err == nil || name == "migrations" {
		return f, err
	}
	return o.b.Open(strings.Replace(name, "migrations/", "partitioned/", 1))
}

func (o overlay) ReadDir(name string) ([]fs.DirEntry, error) {
	ea, err := o.a.ReadDir(name)
	if err != nil {
		return nil, err
	}
	eb, err := o.b.ReadDir("partitioned")
	if err != nil {
		return nil, err
	}
	return append(ea, eb...), nil
}

// partitionQueries rewrites the inbox's own statements for the
// partitioned table (the claim protocol's are rewritten in inboxsql): an
// acquire names its bucket, and GC deletes no rows: it drops partitions
// (dropExpired).
func partitionQueries(q *queries, table string, cfg Config) {
	insert := func(sql string) string {
		return inboxsql.PartitionInsert(sql, "SELECT ", "$2::uuid", table, inboxsql.Partitioning(cfg.Partitioning), cfg.PartitionInterval, cfg.Retention)
	}
	q.acquire = insert(q.acquire)
	q.acquireAsync = insert(q.acquireAsync)
	q.gc = `SELECT $1::int WHERE false`
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
// it; it does nothing on an unpartitioned inbox.
func (s *Store) EnsurePartitions(ctx context.Context) error {
	if s.cfg.Partitioning == Unpartitioned {
		return nil
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
		return now, nil, fmt.Errorf("inbox: list partitions: %w", inboxsql.NotMigrated(err))
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
