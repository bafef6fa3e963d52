package inbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/migrate"
)

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

// Config configures a Store: the table (Schema, Table), keys (MaxKeyLen),
// Retention, ConnectionCheckInterval, AsyncAcquire and the layout
// (Partitioning, PartitionInterval, BoundaryGrace). The zero value is
// valid; each field's documentation gives its default. It is the one
// configuration of the inbox table: a consumer's Config.Inbox is the same
// type, and the Store it opens is the one its claims run on.
type Config = inboxsql.Config

// The defaults of [Config].
const (
	SchemaDefault                  = inboxsql.SchemaDefault
	TableDefault                   = inboxsql.TableDefault
	MaxKeyLenDefault               = inboxsql.MaxKeyLenDefault
	RetentionDefault               = inboxsql.RetentionDefault
	ConnectionCheckIntervalDefault = inboxsql.ConnectionCheckIntervalDefault
	// PartitionIntervalByKeyDefault is Config.PartitionInterval under
	// PartitionByKey; under PartitionByArrival it defaults to Retention.
	PartitionIntervalByKeyDefault = inboxsql.PartitionIntervalByKeyDefault
	BoundaryGraceDefault          = inboxsql.BoundaryGraceDefault
	// PartitionsAhead is how many buckets past the current one GC and
	// EnsurePartitions create; a PartitionByKey key may be at most that
	// far ahead of the clock.
	PartitionsAhead = inboxsql.PartitionsAhead
)

// ConnectionCheckDisabled as Config.ConnectionCheckInterval leaves the
// server's client_connection_check_interval alone (Postgres before 14 has
// none).
const ConnectionCheckDisabled = inboxsql.ConnectionCheckDisabled

// Partitioning is the layout of the inbox table (Config.Partitioning);
// its constants document each layout.
type Partitioning = inboxsql.Partitioning

// The layouts.
const (
	// Unpartitioned is one plain table, its records deleted by GC in
	// batches. The default.
	Unpartitioned = inboxsql.Unpartitioned
	// PartitionByArrival partitions records by arrival time, for keys of
	// any form.
	PartitionByArrival = inboxsql.PartitionByArrival
	// PartitionByKey partitions records by the time in their UUIDv7 key.
	PartitionByKey = inboxsql.PartitionByKey
)

// Status is where a record stands in the state machine
// IN_PROGRESS -> SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL. Its String
// method gives those names.
type Status = inboxsql.Status

const (
	// InProgress: a leased worker owns the key until its lease runs out.
	InProgress = inboxsql.InProgress
	// Succeeded: the message was applied; redeliveries are duplicates.
	Succeeded = inboxsql.Succeeded
	// FailedRetryable: an attempt failed; the next claim or Acquire takes
	// over.
	FailedRetryable = inboxsql.FailedRetryable
	// FailedFinal: the message is a dead letter, kept with its last error.
	FailedFinal = inboxsql.FailedFinal
)

// Record is the stored state of one (scope, key): Scope, Key,
// Fingerprint, Status, the lease (Owner, LeaseUntil, Token), Attempts and
// Failures, the stored Result, LastError and its ErrorClass, the
// Superseded fingerprints of a released conflict, and CreatedAt,
// UpdatedAt, ExpiresAt.
type Record = inboxsql.Record

// ConflictError reports a key seen before with a different payload
// fingerprint (Key, Fingerprint, and the Stored record). The message is
// not applied: a reused key with another payload is a producer bug that
// must surface, never be skipped. It matches idemq.ErrConflict, as
// request.ConflictError does.
type ConflictError = inboxsql.ConflictError

// AcquireResult is the outcome of [Store.Acquire]: New with the caller's
// Lease and the Failures before it, or the Existing record.
type AcquireResult = inboxsql.AcquireResult

var (
	// ErrInvalidKey reports an empty key, a key over the limit, one that
	// is not valid UTF-8 or contains NUL, or one the layout cannot place
	// (PartitionByKey: not a UUIDv7, or its time outside the partitions'
	// span).
	ErrInvalidKey = inboxsql.ErrInvalidKey
	// ErrNotFound reports that no inbox record exists for the key; it is
	// idemq.ErrNotFound, as request.ErrNotFound is.
	ErrNotFound = inboxsql.ErrNotFound
	// ErrNotMigrated is matched by the error of a Store call on a database
	// whose inbox tables are missing or older than this version expects.
	ErrNotMigrated = inboxsql.ErrNotMigrated
	// ErrNoPartition is matched by the error of a claim on a partitioned
	// inbox whose bucket has no partition: GC (or the maintenance service)
	// has not run for longer than the partitions made ahead last. It is
	// retryable.
	ErrNoPartition = inboxsql.ErrNoPartition
)

// MinLeaseTTL is the shortest lease Acquire and Extend take: a shorter
// one runs out before its holder can use it, and under Postgres's 1 µs
// interval unit it would be stored as none at all.
const MinLeaseTTL = inboxsql.MinLeaseTTL

// Store is the inbox of one database: its setup, administration and
// leases. Consumers claim keys through package consumer, on the Store
// their Config opens. It is safe for concurrent use.
type Store inboxsql.Store

// New returns a Store on db; call [Store.Migrate] once before use.
// Invalid settings in cfg are an *idemq.ConfigError (idemq.ErrConfig),
// among them PartitionInterval or BoundaryGrace set on an Unpartitioned
// inbox.
func New(db DB, cfg Config) (*Store, error) {
	core, err := inboxsql.New(db, cfg, "inbox")
	if err != nil {
		return nil, err
	}
	return (*Store)(core), nil
}

func (s *Store) core() *inboxsql.Store { return (*inboxsql.Store)(s) }

// Migrate creates or upgrades the inbox tables on the Store's handle
// ([migrate.New] of this Store alone), creates the partitions due, and
// refuses (idemq.ErrConfig) a table whose layout is not the Config's:
// a plain Config on a partitioned table or the reverse. It is idempotent
// and safe to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error { return s.core().Migrate(ctx) }

// PendingMigrations returns the migrations Migrate would apply, in order;
// none once the tables are up to date.
func (s *Store) PendingMigrations(ctx context.Context) ([]migrate.Migration, error) {
	return s.core().PendingMigrations(ctx)
}

// MigrationSource implements [migrate.Store]: the inbox tables' migrations.
func (s *Store) MigrationSource() migrate.Source { return s.core().MigrationSource() }

// Config returns the configuration with its defaults filled in.
func (s *Store) Config() Config { return s.core().Config() }

// Get returns the record of (scope, key), or ErrNotFound.
func (s *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	return s.core().Get(ctx, scope, key)
}

// Lookup returns the records of key in every scope, most recently updated
// first: what happened to a message of that key, whichever consumer
// applied it. It probes the primary key once per scope. None is an empty
// slice, not an error.
func (s *Store) Lookup(ctx context.Context, key string) ([]Record, error) {
	return s.core().Lookup(ctx, key)
}

// GC deletes records and recorded conflicts whose retention ran out,
// batchSize at a time (each batch its own short statement, through an
// expires_at index), until none is left, and returns how many it deleted.
// Records under a live lease are kept. On a partitioned inbox it drops
// expired partitions and creates those due instead. batchSize <= 0 means
// 1000.
func (s *Store) GC(ctx context.Context, batchSize int) (int64, error) {
	return s.core().GC(ctx, batchSize)
}

// EnsurePartitions creates the partitions of a partitioned inbox that are
// due: under PartitionByArrival the current bucket and PartitionsAhead
// more, under PartitionByKey every bucket from Retention ago to
// PartitionsAhead ahead. Each is created as a plain table with a CHECK
// constraint and attached, which takes only SHARE UPDATE EXCLUSIVE on the
// inbox (claims go on) and skips the validation scan. Migrate and GC call
// it. It first refuses (idemq.ErrConfig) a table whose layout is not the
// Config's, as Migrate does; on an unpartitioned inbox it does nothing
// else.
func (s *Store) EnsurePartitions(ctx context.Context) error { return s.core().EnsurePartitions(ctx) }

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
	return s.core().PrepareLivePartitioning(ctx)
}

// Acquire claims key for owner for the duration ttl, for side effects
// outside Postgres. It takes the key when it is new, when the last attempt
// failed retryably, or when the holder's lease ran out (a takeover); each
// claim hands out a larger fencing token in the result's Lease, and
// Failures says how many earlier attempts failed (a takeover of an expired
// lease is not a failure).
//
// Otherwise Existing is the stored record: Succeeded (a duplicate,
// with its stored result), InProgress under a live lease (someone else is
// working on it until Existing.LeaseUntil), or FailedFinal (a dead letter).
// A different fingerprint is a *ConflictError.
func (s *Store) Acquire(ctx context.Context, scope, key string, fingerprint []byte, owner string, ttl time.Duration) (AcquireResult, error) {
	return s.core().Acquire(ctx, scope, key, fingerprint, owner, ttl)
}

// Complete finalizes a lease as SUCCEEDED with an optional result to
// replay to later duplicates. It fails with idemq.ErrLeaseLost when the
// lease was taken over or already finalized; the successor's outcome then
// stands.
func (s *Store) Complete(ctx context.Context, lease idemq.Lease, result []byte) error {
	return s.core().Complete(ctx, lease, result)
}

// CompleteTx is [Store.Complete] inside the caller's transaction, so that
// the finalize commits with the caller's own writes; if tx rolls back, the
// lease stays as it was and runs out.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, result []byte) error {
	return s.core().CompleteTx(ctx, tx, lease, result)
}

// Fail finalizes a lease after a failed attempt as FAILED_RETRYABLE: the
// key goes to the next Acquire at once, with one more failure counted and
// cause kept as the record's last error. It fails with idemq.ErrLeaseLost
// like [Store.Complete].
func (s *Store) Fail(ctx context.Context, lease idemq.Lease, cause error) error {
	return s.core().Fail(ctx, lease, cause)
}

// FailTx is [Store.Fail] inside the caller's transaction; if tx rolls
// back, the lease stays as it was and runs out.
func (s *Store) FailTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, cause error) error {
	return s.core().FailTx(ctx, tx, lease, cause)
}

// FailFinal finalizes a lease after a failed attempt as FAILED_FINAL: the
// message is a dead letter, kept with cause. It fails with
// idemq.ErrLeaseLost like [Store.Complete].
func (s *Store) FailFinal(ctx context.Context, lease idemq.Lease, cause error) error {
	return s.core().FailFinal(ctx, lease, cause)
}

// FailFinalTx is [Store.FailFinal] inside the caller's transaction; if tx
// rolls back, the lease stays as it was and runs out.
func (s *Store) FailFinalTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, cause error) error {
	return s.core().FailFinalTx(ctx, tx, lease, cause)
}

// Abandon gives the key back before its lease runs out, for a holder that
// stops without an outcome (its context was cancelled, it shuts down): no
// failure is counted and the next Acquire takes over at once instead of
// waiting for the deadline. It fails with idemq.ErrLeaseLost like
// [Store.Complete].
func (s *Store) Abandon(ctx context.Context, lease idemq.Lease) error {
	return s.core().Abandon(ctx, lease)
}

// Extend moves the lease's deadline to ttl from now, for work that runs
// longer than planned, and returns the extended lease. It fails with
// idemq.ErrLeaseLost when the lease was taken over or finalized.
func (s *Store) Extend(ctx context.Context, lease idemq.Lease, ttl time.Duration) (idemq.Lease, error) {
	return s.core().Extend(ctx, lease, ttl)
}
