package inbox

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is the database handle a Store runs its own statements on (scope
// registration, leases, GC, dead letters): a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx all satisfy it. A pool is the usual choice: a consumer then
// sends the BEGIN of each message's transaction with its claim.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// The defaults of [Config].
const (
	SchemaDefault    = "public"
	TableDefault     = "idemq_inbox"
	MaxKeyLenDefault = 1024
	RetentionDefault = 7 * 24 * time.Hour

	ConnectionCheckIntervalDefault = 2 * time.Second
)

// ConnectionCheckDisabled as Config.ConnectionCheckInterval leaves the
// server's client_connection_check_interval alone (Postgres before 14 has
// none).
const ConnectionCheckDisabled time.Duration = -1

// Config configures a Store. The zero value is valid.
type Config struct {
	// Schema holds the inbox tables. Defaults to "public".
	Schema string
	// Table names the inbox table; its scopes table is Table + "_scopes".
	// Defaults to "idemq_inbox".
	Table string
	// MaxKeyLen bounds keys, in bytes. Defaults to 1024.
	MaxKeyLen int
	// Retention is how long a record is kept after its last change;
	// redeliveries later than that are applied again. Defaults to 7 days.
	Retention time.Duration
	// ConnectionCheckInterval is set as client_connection_check_interval
	// (SET LOCAL) in the transactions a consumer begins to claim keys
	// begin, unless the handle's connection config sets it already. Then a
	// consumer killed while its statement waits (on a lock, say) loses its
	// backend, and so its uncommitted claims, within about this interval
	// instead of whenever that statement ends: the next owner of the key
	// is not held up. It needs Postgres 14 or later on Linux; set
	// ConnectionCheckDisabled for older servers. Defaults to 2 seconds.
	ConnectionCheckInterval time.Duration
	// AsyncAcquire commits the claims of Acquire with synchronous_commit
	// off: the claim's transaction does not wait for its WAL to reach
	// disk, so a claim costs no flush of its own. Nothing else changes:
	// the claim is visible at once, and the transaction that completes
	// the lease (Complete, or CompleteTx with the caller's writes) commits
	// durably, which flushes the claim's earlier WAL with it. Only a
	// Postgres crash within about three wal_writer_delay of a claim can
	// forget it; the key then looks unclaimed, as after its lease ran out,
	// and the holder's finalize is fenced out. A Store on a pgx.Tx
	// ignores it, since the setting would last until that transaction
	// ends. Defaults to false.
	AsyncAcquire bool
	// Partitioning lays the table out in partitions whose expiry is a
	// DROP instead of DELETE and VACUUM (see [Partitioning]); Migrate
	// moves an existing table into the layout, and Down to version 5 out
	// of it. GC then drops expired partitions and creates the next ones.
	// Defaults to Unpartitioned.
	Partitioning Partitioning
	// PartitionInterval is the width of a partition's bucket, a whole
	// number of seconds; keep it the same for the life of the table.
	// Defaults to Retention under PartitionByArrival (where it may not be
	// less) and to 24 hours under PartitionByKey.
	PartitionInterval time.Duration
	// BoundaryGrace is how close to a bucket boundary a claim under
	// PartitionByArrival takes the advisory lock of its key first; a claim
	// transaction must commit within it. Defaults to 1 minute.
	BoundaryGrace time.Duration
}

func (c Config) withDefaults() Config {
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.Table = cmp.Or(c.Table, TableDefault)
	c.MaxKeyLen = cmp.Or(c.MaxKeyLen, MaxKeyLenDefault)
	c.Retention = cmp.Or(c.Retention, RetentionDefault)
	c.ConnectionCheckInterval = cmp.Or(c.ConnectionCheckInterval, ConnectionCheckIntervalDefault)
	return c.partitionDefaults()
}

func (c Config) validate() error {
	switch {
	case c.MaxKeyLen < 0:
		return idemq.NewConfigError("inbox", "MaxKeyLen", "%d is negative", c.MaxKeyLen)
	case c.Retention < 0:
		return idemq.NewConfigError("inbox", "Retention", "%v is negative", c.Retention)
	case c.Retention < time.Microsecond:
		return idemq.NewConfigError("inbox", "Retention", "%v is below Postgres's interval unit of 1µs", c.Retention)
	case c.ConnectionCheckInterval < 0 && c.ConnectionCheckInterval != ConnectionCheckDisabled:
		return idemq.NewConfigError("inbox", "ConnectionCheckInterval", "%v is negative; use ConnectionCheckDisabled to turn it off", c.ConnectionCheckInterval)
	case c.ConnectionCheckInterval > 0 && c.ConnectionCheckInterval < time.Millisecond:
		return idemq.NewConfigError("inbox", "ConnectionCheckInterval", "%v is below the server's unit of 1ms", c.ConnectionCheckInterval)
	}
	return c.validatePartitioning()
}

// Store is the inbox of one database: its setup, administration and
// leases. Consumers claim keys through package consumer. It is safe for
// concurrent use.
type Store struct {
	db    DB
	cfg   Config
	core  *inboxsql.Store
	table pgutil.Table
	sql   queries
}

// New returns a Store on db; call [Store.Migrate] once before use.
func New(db DB, cfg Config) (*Store, error) {
	if pgtx.IsNil(db) {
		return nil, idemq.NewConfigError("inbox", "db", "is nil; pass a *pgxpool.Pool")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	table, err := pgutil.ConfigTable("inbox", cfg.Schema, cfg.Table)
	if err != nil {
		return nil, err
	}
	core, err := inboxsql.New(db, inboxsql.Options{Schema: cfg.Schema, Table: cfg.Table, MaxKeyLen: cfg.MaxKeyLen,
		Retention: cfg.Retention, ConnectionCheckInterval: cfg.ConnectionCheckInterval, Conflict: conflictError,
		Partitioning: inboxsql.Partitioning(cfg.Partitioning), PartitionInterval: cfg.PartitionInterval, BoundaryGrace: cfg.BoundaryGrace})
	if err != nil {
		return nil, err
	}
	sql := newQueries(table)
	if _, inTx := db.(pgx.Tx); cfg.AsyncAcquire && !inTx {
		// On a transaction the setting would outlast the claim and make
		// the caller's commit asynchronous too.
		sql.acquire = sql.acquireAsync
	}
	if cfg.Partitioning != Unpartitioned {
		partitionQueries(&sql, table.String(), cfg)
	}
	return &Store{db: db, cfg: cfg, core: core, table: table, sql: sql}, nil
}

// conflictError is the error of a claim whose key has a record with
// another fingerprint.
func conflictError(key string, fingerprint []byte, stored inboxsql.Row) error {
	return &ConflictError{Key: key, Fingerprint: fingerprint, Stored: Record(stored)}
}

// Migrate creates or upgrades the inbox tables on the Store's handle:
// [migrate.New] of this Store alone. It is idempotent and safe to run from
// several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := migrate.New(s.db, s).Migrate(ctx); err != nil {
		return err
	}
	return s.EnsurePartitions(ctx)
}

// PendingMigrations returns the migrations Migrate would apply, in order;
// none once the tables are up to date.
func (s *Store) PendingMigrations(ctx context.Context) ([]migrate.Migration, error) {
	return migrate.New(s.db, s).Pending(ctx)
}

// MigrationSource implements [migrate.Store]: the inbox tables' migrations.
func (s *Store) MigrationSource() migrate.Source {
	return migrate.Source{Component: "inbox", Schema: s.cfg.Schema, Table: s.cfg.Table, Files: s.migrationFiles(), Dir: "migrations"}
}

// Config returns the configuration with its defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// ErrNotMigrated is matched by the error of a Store call on a database
// whose inbox tables are missing or older than this version expects.
var ErrNotMigrated = inboxsql.ErrNotMigrated

// stored reads the record of k on the Store's handle.
func (s *Store) stored(ctx context.Context, k inboxsql.Key) (Record, bool, error) {
	row, found, err := s.core.Stored(ctx, s.db, k)
	return Record(row), found, err
}

// against returns rec as a claim of key with fingerprint sees it (see
// inboxsql.Store.Against): a different fingerprint is a *ConflictError.
func (s *Store) against(rec Record, key string, fingerprint []byte) (Record, error) {
	row, err := s.core.Against(inboxsql.Row(rec), key, fingerprint)
	return Record(row), err
}

// Get returns the record of (scope, key), or ErrNotFound.
func (s *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	k, err := s.core.Resolve(ctx, scope, key, nil)
	if err != nil {
		return Record{}, err
	}
	rec, found, err := s.stored(ctx, k)
	if err == nil && !found {
		err = ErrNotFound
	}
	return rec, err
}

// GC deletes records and recorded conflicts whose retention ran out,
// batchSize at a time (each batch its own short statement, through an
// expires_at index), until none is left, and returns how many it deleted. Records under a live lease are
// kept. batchSize <= 0 means 1000.
func (s *Store) GC(ctx context.Context, batchSize int) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	if err := s.gcPartitions(ctx); err != nil {
		return 0, err
	}
	var total int64
	for _, sql := range []string{s.sql.gc, s.sql.gcConflicts} {
		for {
			tag, err := s.db.Exec(ctx, sql, batchSize)
			if err != nil {
				return total, fmt.Errorf("inbox: gc: %w", inboxsql.NotMigrated(err))
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}
