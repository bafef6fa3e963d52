package inbox

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is the database handle a Store runs its own statements on (scope
// registration, leases, GC, dead letters): a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx all satisfy it. A pool is the usual choice: [Store.BeginClaim]
// then sends its BEGIN with the claim.
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
	// (SET LOCAL) in the transactions that BeginClaim and BeginClaimBatch
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

// Store is the inbox of one database. It is safe for concurrent use.
type Store struct {
	db    DB
	cfg   Config
	table pgutil.Table
	sql   queries

	// connCheck is the client_connection_check_interval to set in the
	// transactions the Store begins, "" for none.
	connCheck string

	mu     sync.RWMutex
	scopes map[string]int32
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
	sql := newQueries(table)
	if _, inTx := db.(pgx.Tx); cfg.AsyncAcquire && !inTx {
		// On a transaction the setting would outlast the claim and make
		// the caller's commit asynchronous too.
		sql.acquire = sql.acquireAsync
	}
	if cfg.Partitioning != Unpartitioned {
		partitionQueries(&sql, table.String(), cfg)
	}
	return &Store{db: db, cfg: cfg, table: table, sql: sql, connCheck: connCheck(db, cfg), scopes: map[string]int32{}}, nil
}

// connCheck returns the client_connection_check_interval a Store sets, in
// milliseconds, or "" when it is disabled or db's connections set their
// own.
func connCheck(db DB, cfg Config) string {
	if cfg.ConnectionCheckInterval == ConnectionCheckDisabled {
		return ""
	}
	var params map[string]string
	switch db := db.(type) {
	case *pgxpool.Pool:
		params = db.Config().ConnConfig.RuntimeParams
	case *pgx.Conn:
		params = db.Config().RuntimeParams
	}
	if _, set := params["client_connection_check_interval"]; set {
		return ""
	}
	return strconv.FormatInt(cfg.ConnectionCheckInterval.Milliseconds(), 10)
}

// begin begins a transaction on the Store's handle with b's statements, in
// one round trip, after setting the connection check.
func (s *Store) begin(ctx context.Context, b *pgx.Batch) (pgx.Tx, error) {
	if s.connCheck != "" {
		b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: setConnCheck, Arguments: []any{s.connCheck}}}, b.QueuedQueries...)
	}
	return pgtx.BeginBatch(ctx, s.db, b)
}

// setConnCheck is SET LOCAL client_connection_check_interval with a
// parameter.
const setConnCheck = `SELECT set_config('client_connection_check_interval', $1, true)`

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

// RegisterScope makes sure scope has its id, so that claims of the scope
// inside a transaction need no second connection. Claims register an
// unknown scope themselves on the Store's own handle; call RegisterScope
// first when that handle is a pool that the transaction may exhaust.
func (s *Store) RegisterScope(ctx context.Context, scope string) error {
	_, err := s.scopeID(ctx, scope)
	return err
}

// scopeID returns the small integer that stands for scope in the inbox
// table, registering the scope on first use. It runs on the Store's own
// handle, never inside a caller's transaction, so a rollback there cannot
// undo a registration another process already relies on.
func (s *Store) scopeID(ctx context.Context, scope string) (int32, error) {
	s.mu.RLock()
	id, ok := s.scopes[scope]
	s.mu.RUnlock()
	if ok {
		return id, nil
	}
	if scope == "" || len(scope) > 200 {
		return 0, fmt.Errorf("inbox: scope must be 1 to 200 bytes, got %d", len(scope))
	}
	// The insert skips a concurrent registration without seeing it; the
	// next statement's snapshot does.
	for range 2 {
		err := s.db.QueryRow(ctx, s.sql.registerScope, scope).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("inbox: register scope %q: %w", scope, notMigrated(err))
		}
		s.mu.Lock()
		s.scopes[scope] = id
		s.mu.Unlock()
		return id, nil
	}
	return 0, fmt.Errorf("inbox: register scope %q: not visible after insert", scope)
}

// ErrNotMigrated is matched by the error of a Store call on a database
// whose inbox tables are missing or older than this version expects.
var ErrNotMigrated = errors.New("inbox: the inbox tables are missing or out of date: run `idemq migrate` or Store.Migrate (consumer.Consumer.Migrate) first")

// notMigrated marks err with ErrNotMigrated when Postgres reports an
// undefined table (42P01) or column (42703).
func notMigrated(err error) error {
	if pg := (*pgconn.PgError)(nil); errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703") {
		return fmt.Errorf("%w: %w", ErrNotMigrated, err)
	}
	return err
}

// errNilTx reports a nil transaction passed to a Tx method.
var errNilTx = errors.New("inbox: nil transaction")

// ClaimTx records key in tx as applied (SUCCEEDED). The record commits or
// rolls back with tx, so it exists exactly when the message's side effects
// in tx do: if tx rolls back, the key is unclaimed again.
//
// New reports that the caller must apply the message in tx: the key was
// unclaimed, or its earlier attempts failed (Failures counts them).
// Otherwise Existing is the stored record (a duplicate, a dead letter or a
// leased key) and, when its fingerprint differs, the error is a
// *ConflictError. If another transaction holds an uncommitted claim of the
// key, ClaimTx waits for it: then it sees a duplicate if that transaction
// commits and claims the key if it rolls back.
func (s *Store) ClaimTx(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte) (ClaimResult, error) {
	if pgtx.IsNil(tx) {
		return ClaimResult{}, errNilTx
	}
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return ClaimResult{}, err
	}
	return s.claim(ctx, tx, k)
}

// BeginClaim begins a transaction on the Store's handle and claims key in
// it as [Store.ClaimTx] does, in one round trip: the BEGIN travels with the
// claim. It is the fast path for callers that start a transaction per
// message. Unless the error is other than nil or a *ConflictError, the
// caller owns tx and must commit or roll it back.
func (s *Store) BeginClaim(ctx context.Context, scope, key string, fingerprint []byte) (pgx.Tx, ClaimResult, error) {
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return nil, ClaimResult{}, err
	}
	var inserted bool
	b := &pgx.Batch{}
	s.queueBoundaryLock(b, k.scopeID, k.id)
	b.Queue(s.sql.claim, k.args(s.cfg.Retention)...).Exec(func(tag pgconn.CommandTag) error {
		inserted = tag.RowsAffected() == 1
		return nil
	})
	tx, err := s.begin(ctx, b)
	if err != nil {
		return nil, ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", key, err)
	}
	if inserted {
		return tx, ClaimResult{New: true}, nil
	}
	c, err := s.claimExisting(ctx, tx, k)
	if conflict := (*ConflictError)(nil); err != nil && !errors.As(err, &conflict) {
		return nil, ClaimResult{}, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, c, err
}

// claim inserts the record of a new key, or takes over a failed one.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, k keyArgs) (ClaimResult, error) {
	if err := s.boundaryLock(ctx, tx, k.scopeID, k.id); err != nil {
		return ClaimResult{}, err
	}
	tag, err := tx.Exec(ctx, s.sql.claim, k.args(s.cfg.Retention)...)
	if err != nil {
		return ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", k.key, err)
	}
	if tag.RowsAffected() == 1 {
		return ClaimResult{New: true}, nil
	}
	return s.claimExisting(ctx, tx, k)
}

// claimExisting is the duplicate path of a claim whose insert found a
// record: it reads the record and takes it over if its attempts failed.
// A record deleted meanwhile (by GC) is claimed afresh.
func (s *Store) claimExisting(ctx context.Context, tx pgx.Tx, k keyArgs) (ClaimResult, error) {
	for range 3 {
		rec, found, err := s.stored(ctx, tx, k)
		switch {
		case err != nil:
			return ClaimResult{}, err
		case !found:
			tag, err := tx.Exec(ctx, s.sql.claim, k.args(s.cfg.Retention)...)
			if err != nil {
				return ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", k.key, err)
			}
			if tag.RowsAffected() == 1 {
				return ClaimResult{New: true}, nil
			}
			continue
		}
		if rec, err = against(rec, k.key, k.fingerprint); err != nil || rec.Status != FailedRetryable {
			return ClaimResult{Existing: &rec}, err
		}
		var failures int32
		err = tx.QueryRow(ctx, s.sql.takeOver, k.scopeID, k.id, k.fingerprint, s.cfg.Retention).Scan(&failures)
		if err == nil {
			return ClaimResult{New: true, Failures: int(failures)}, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return ClaimResult{}, fmt.Errorf("inbox: claim %q: %w", k.key, err)
		}
		// Another claim completed or changed the record first: read it again.
	}
	return ClaimResult{}, fmt.Errorf("inbox: claim %q: the record kept changing", k.key)
}

// RecordFailure counts a failed attempt at key on the Store's own handle,
// after the attempt's transaction rolled back: the record becomes (or
// stays) FAILED_RETRYABLE with cause as its last error and one more
// failure, so the count survives crashes and redeliveries. It returns the
// record as it stands: a record that another attempt completed or
// dead-lettered meanwhile is returned unchanged, and a different
// fingerprint is a *ConflictError.
//
// Call it only for real failures of the message's handler: a crash, a
// lost connection or a cancelled context is not a failure.
func (s *Store) RecordFailure(ctx context.Context, scope, key string, fingerprint []byte, cause error) (Record, error) {
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return Record{}, err
	}
	for range 3 {
		var rec storedRecord
		err := s.db.QueryRow(ctx, s.sql.recordFailure, append(k.args(s.cfg.Retention), errText(cause))...).Scan(rec.dest()...)
		if err == nil {
			return rec.record(scope, key), nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return Record{}, fmt.Errorf("inbox: record failure of %q: %w", key, err)
		}
		found, ok, err := s.stored(ctx, s.db, k)
		if err != nil {
			return Record{}, err
		}
		if ok {
			return against(found, key, k.fingerprint)
		}
	}
	return Record{}, fmt.Errorf("inbox: record failure of %q: the record kept changing", key)
}

// FailClaimTx counts a failed attempt at a key that tx claimed (New from
// [Store.ClaimTx] or [Store.ClaimBatchTx]) when tx goes on and commits
// without the message's effects, as a batch does after rewinding the
// handler to its savepoint: the record becomes FAILED_RETRYABLE with cause
// and one more failure. If tx rolls back, so does the count and the claim.
func (s *Store) FailClaimTx(ctx context.Context, tx pgx.Tx, scope, key string, cause error) (Record, error) {
	if pgtx.IsNil(tx) {
		return Record{}, errNilTx
	}
	k, err := s.resolve(ctx, scope, key, nil)
	if err != nil {
		return Record{}, err
	}
	var rec storedRecord
	err = tx.QueryRow(ctx, s.sql.failClaim, k.scopeID, k.id, errText(cause)).Scan(rec.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("inbox: fail claim %q: the key is not claimed in this transaction", key)
	}
	if err != nil {
		return Record{}, fmt.Errorf("inbox: fail claim %q: %w", key, err)
	}
	return rec.record(scope, key), nil
}

// UnclaimTx undoes the claim of key that tx made (New from [Store.ClaimTx]
// or [Store.ClaimBatchTx]) without counting a failure, for an attempt that
// says nothing about the message (a deadlock, a serialization failure)
// when tx goes on and commits: the key is as it was before the claim. If
// tx rolls back, so does the claim anyway.
func (s *Store) UnclaimTx(ctx context.Context, tx pgx.Tx, scope, key string) error {
	if pgtx.IsNil(tx) {
		return errNilTx
	}
	k, err := s.resolve(ctx, scope, key, nil)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.QueryRow(ctx, s.sql.unclaim, k.scopeID, k.id).Scan(&n); err != nil {
		return fmt.Errorf("inbox: unclaim %q: %w", key, err)
	}
	if n == 0 {
		return fmt.Errorf("inbox: unclaim %q: the key is not claimed in this transaction", key)
	}
	return nil
}

// DeadLetterTx records key in tx as FAILED_FINAL with cause and the number
// of failed attempts, so that redeliveries are recognised and not applied.
// It takes over a record whose attempts failed; any other stored record is
// kept and reported as by [Store.ClaimTx]. If tx rolls back, so does the
// dead letter.
func (s *Store) DeadLetterTx(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte, failures int, cause error) (ClaimResult, error) {
	if pgtx.IsNil(tx) {
		return ClaimResult{}, errNilTx
	}
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return ClaimResult{}, err
	}
	text := errText(cause)
	if text == "" {
		text = "dead letter"
	}
	for range 2 {
		tag, err := tx.Exec(ctx, s.sql.deadLetter, append(k.args(s.cfg.Retention), failures, text)...)
		if err != nil {
			return ClaimResult{}, fmt.Errorf("inbox: dead-letter %q: %w", key, err)
		}
		if tag.RowsAffected() == 1 {
			return ClaimResult{New: true}, nil
		}
		rec, found, err := s.stored(ctx, tx, k)
		if err != nil {
			return ClaimResult{}, err
		}
		if found {
			rec, err := against(rec, key, k.fingerprint)
			return ClaimResult{Existing: &rec}, err
		}
	}
	return ClaimResult{}, fmt.Errorf("inbox: dead-letter %q: record vanished twice", key)
}

// errText is the stored text of a failure's cause.
func errText(cause error) string { return errtext.Of(cause) }

// keyArgs is a validated key with everything its statements need.
type keyArgs struct {
	scope, key  string
	scopeID     int32
	id          uuid.UUID
	text        *string
	fingerprint []byte
}

func (s *Store) resolve(ctx context.Context, scope, key string, fingerprint []byte) (keyArgs, error) {
	if err := s.Validate(key, fingerprint); err != nil {
		return keyArgs{}, err
	}
	scopeID, err := s.scopeID(ctx, scope)
	if err != nil {
		return keyArgs{}, err
	}
	id, text := keyID(key)
	if err := s.checkPartitionKey(id, text); err != nil {
		return keyArgs{}, err
	}
	return keyArgs{scope: scope, key: key, scopeID: scopeID, id: id, text: text, fingerprint: nonNil(fingerprint)}, nil
}

// args are the first arguments of the statements that insert a record:
// scope, key id, fingerprint, key text, retention.
func (k keyArgs) args(retention time.Duration) []any {
	return []any{k.scopeID, k.id, k.fingerprint, k.text, retention}
}

// stored reads the record a claim found, the duplicate path. In a READ
// COMMITTED transaction this new statement sees the record even if it
// committed concurrently, after the insert's snapshot (the insert waited
// for it, then skipped).
func (s *Store) stored(ctx context.Context, db DB, k keyArgs) (Record, bool, error) {
	var rec storedRecord
	err := db.QueryRow(ctx, s.sql.get, k.scopeID, k.id).Scan(rec.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("inbox: read record %q: %w", k.key, err)
	}
	return rec.record(k.scope, k.key), true, nil
}

// ClaimBatchTx claims every item in tx, like [Store.ClaimTx] for each, with
// one statement for the new keys. Keys must be distinct. The result has one
// BatchClaim per item, in order; an invalid key or a conflict is reported
// in that BatchClaim's Err, not as the error, which is reserved for
// failures of the whole batch. If tx rolls back, so do all the claims.
func (s *Store) ClaimBatchTx(ctx context.Context, tx pgx.Tx, scope string, items []Item) ([]BatchClaim, error) {
	if pgtx.IsNil(tx) {
		return nil, errNilTx
	}
	scopeID, err := s.scopeID(ctx, scope)
	if err != nil {
		return nil, err
	}
	claims := make([]BatchClaim, len(items))
	index := make(map[uuid.UUID]int, len(items))
	ids := make([]uuid.UUID, 0, len(items))
	fingerprints := make([][]byte, 0, len(items))
	texts := make([]*string, 0, len(items))
	for i, it := range items {
		if err := s.Validate(it.Key, it.Fingerprint); err != nil {
			claims[i].Err = err
			continue
		}
		id, text := keyID(it.Key)
		if err := s.checkPartitionKey(id, text); err != nil {
			claims[i].Err = err
			continue
		}
		if _, dup := index[id]; dup {
			return nil, fmt.Errorf("inbox: key %q appears twice in the batch", it.Key)
		}
		index[id] = i
		ids = append(ids, id)
		fingerprints = append(fingerprints, nonNil(it.Fingerprint))
		texts = append(texts, text)
	}
	if len(ids) == 0 {
		return claims, nil
	}

	if err := s.boundaryLock(ctx, tx, scopeID, ids...); err != nil {
		return nil, err
	}
	// The duplicate path, read only for keys the insert skipped; failed
	// keys are taken over, and a key GC deleted in between is claimed
	// again.
	for range 3 {
		skipped, err := s.claimMissing(ctx, tx, scopeID, ids, fingerprints, texts, index, claims)
		if err != nil || len(skipped) == 0 {
			return claims, err
		}
		if err := s.readBatch(ctx, tx, scope, scopeID, skipped, items, index, claims); err != nil {
			return nil, err
		}
		if err := s.takeOverBatch(ctx, tx, scopeID, skipped, index, claims); err != nil {
			return nil, err
		}
		ids, fingerprints, texts = unresolved(claims, index, ids, fingerprints, texts)
		if len(ids) == 0 {
			return claims, nil
		}
	}
	return nil, errors.New("inbox: claim batch: the records kept changing")
}

// BeginClaimBatch begins a transaction on the Store's handle and claims
// the items in it as [Store.ClaimBatchTx] does. Unless the error is not
// nil, the caller owns tx and must commit or roll it back.
func (s *Store) BeginClaimBatch(ctx context.Context, scope string, items []Item) (pgx.Tx, []BatchClaim, error) {
	if _, err := s.scopeID(ctx, scope); err != nil {
		return nil, nil, err
	}
	tx, err := s.begin(ctx, &pgx.Batch{})
	if err != nil {
		return nil, nil, fmt.Errorf("inbox: claim batch: %w", err)
	}
	claims, err := s.ClaimBatchTx(ctx, tx, scope, items)
	if err != nil {
		return nil, nil, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, claims, nil
}

// claimMissing inserts the keys and marks the claimed ones New; it returns
// the ids it skipped because they have a record.
func (s *Store) claimMissing(ctx context.Context, tx pgx.Tx, scopeID int32, ids []uuid.UUID, fingerprints [][]byte, texts []*string, index map[uuid.UUID]int, claims []BatchClaim) ([]uuid.UUID, error) {
	rows, err := tx.Query(ctx, s.sql.claimBatch, scopeID, ids, fingerprints, texts, s.cfg.Retention)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("inbox: claim batch: %w", err)
	}
	for _, id := range claimed {
		claims[index[id]].New = true
	}
	if len(claimed) == len(ids) {
		return nil, nil
	}
	var skipped []uuid.UUID
	for _, id := range ids {
		if !claims[index[id]].New {
			skipped = append(skipped, id)
		}
	}
	return skipped, nil
}

// readBatch reads the records of the skipped keys into their claims.
func (s *Store) readBatch(ctx context.Context, tx pgx.Tx, scope string, scopeID int32, skipped []uuid.UUID, items []Item, index map[uuid.UUID]int, claims []BatchClaim) error {
	rows, err := tx.Query(ctx, s.sql.getBatch, scopeID, skipped)
	if err != nil {
		return fmt.Errorf("inbox: read batch records: %w", err)
	}
	var id uuid.UUID
	var rec storedRecord
	_, err = pgx.ForEachRow(rows, append([]any{&id}, rec.dest()...), func() error {
		i := index[id]
		r, err := against(rec.record(scope, items[i].Key), items[i].Key, nonNil(items[i].Fingerprint))
		claims[i] = BatchClaim{ClaimResult: ClaimResult{Existing: &r}, Err: err}
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox: read batch records: %w", err)
	}
	return nil
}

// takeOverBatch claims the skipped keys whose attempts failed. One that
// changed since it was read is left unresolved, to be read again.
func (s *Store) takeOverBatch(ctx context.Context, tx pgx.Tx, scopeID int32, skipped []uuid.UUID, index map[uuid.UUID]int, claims []BatchClaim) error {
	var ids []uuid.UUID
	var fingerprints [][]byte
	for _, id := range skipped {
		if c := claims[index[id]]; c.Err == nil && c.Existing != nil && c.Existing.Status == FailedRetryable {
			ids = append(ids, id)
			fingerprints = append(fingerprints, c.Existing.Fingerprint)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.sql.takeOverBatch, scopeID, ids, fingerprints, s.cfg.Retention)
	if err != nil {
		return fmt.Errorf("inbox: claim batch: %w", err)
	}
	var id uuid.UUID
	var failures int32
	taken := make(map[uuid.UUID]bool, len(ids))
	_, err = pgx.ForEachRow(rows, []any{&id, &failures}, func() error {
		taken[id] = true
		claims[index[id]] = BatchClaim{ClaimResult: ClaimResult{New: true, Failures: int(failures)}}
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox: claim batch: %w", err)
	}
	for _, id := range ids {
		if !taken[id] {
			claims[index[id]] = BatchClaim{} // changed meanwhile: read it again
		}
	}
	return nil
}

// unresolved keeps the keys of a batch that neither were claimed nor found.
func unresolved(claims []BatchClaim, index map[uuid.UUID]int, ids []uuid.UUID, fingerprints [][]byte, texts []*string) ([]uuid.UUID, [][]byte, []*string) {
	n := 0
	for k, id := range ids {
		if c := claims[index[id]]; !c.New && c.Existing == nil && c.Err == nil {
			ids[n], fingerprints[n], texts[n] = id, fingerprints[k], texts[k]
			n++
		}
	}
	return ids[:n], fingerprints[:n], texts[:n]
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Get returns the record of (scope, key), or ErrNotFound.
func (s *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	k, err := s.resolve(ctx, scope, key, nil)
	if err != nil {
		return Record{}, err
	}
	rec, found, err := s.stored(ctx, s.db, k)
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
				return total, fmt.Errorf("inbox: gc: %w", notMigrated(err))
			}
			total += tag.RowsAffected()
			if tag.RowsAffected() < int64(batchSize) {
				break
			}
		}
	}
	return total, nil
}

// storedRecord scans a record; its nullable columns go through pointers.
type storedRecord struct {
	Record
	attempts         int32
	failures         int32
	token            *int64
	owner, lastError *string
	leaseUntil       *time.Time
}

// dest lists scan targets in the order of recordColumns.
func (r *storedRecord) dest() []any {
	return []any{&r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &r.attempts, &r.failures, &r.Status,
		&r.Fingerprint, &r.owner, &r.leaseUntil, &r.Result, &r.lastError, &r.Superseded, &r.token}
}

func (r *storedRecord) record(scope, key string) Record {
	rec := r.Record
	rec.Scope, rec.Key, rec.Attempts, rec.Failures = scope, key, int(r.attempts), int(r.failures)
	rec.Owner, rec.LeaseUntil, rec.LastError = deref(r.owner), deref(r.leaseUntil), deref(r.lastError)
	rec.Token = deref(r.token)
	return rec
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
