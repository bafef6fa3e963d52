package inbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/internal/pgutil"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is the database handle a Store runs its own statements on (scope
// lookups, leases, GC): a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DB = pgutil.DB

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
}

func (c Config) withDefaults() (Config, error) {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.Table == "" {
		c.Table = "idemq_inbox"
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = 1024
	}
	if c.Retention == 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.MaxKeyLen < 0 || c.Retention < 0 {
		return c, errors.New("inbox: MaxKeyLen and Retention must not be negative")
	}
	return c, nil
}

// Store is the inbox of one database. It is safe for concurrent use.
type Store struct {
	db    DB
	cfg   Config
	table pgutil.Table
	sql   queries

	mu     sync.RWMutex
	scopes map[string]int32
}

// New returns a Store on db; call [Store.Migrate] once before use.
func New(db DB, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	table, err := pgutil.NewTable(cfg.Schema, cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, cfg: cfg, table: table, sql: newQueries(table), scopes: map[string]int32{}}, nil
}

// Migrate creates or upgrades the inbox tables. It is idempotent and safe
// to run from several processes at once.
func (s *Store) Migrate(ctx context.Context) error {
	return pgutil.Migrate(ctx, s.db, migrations, "migrations", "inbox", s.table)
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
			return 0, fmt.Errorf("inbox: register scope %q: %w", scope, err)
		}
		s.mu.Lock()
		s.scopes[scope] = id
		s.mu.Unlock()
		return id, nil
	}
	return 0, fmt.Errorf("inbox: register scope %q: not visible after insert", scope)
}

// Claim records key in tx as applied (SUCCEEDED). The record commits or
// rolls back with tx, so it exists exactly when the message's side effects
// in tx do.
//
// New reports that the key was unclaimed and the caller must apply the
// message in tx. Otherwise Existing is the stored record (a duplicate) and,
// when its fingerprint differs, the error is a *ConflictError. If another
// transaction holds an uncommitted claim of the key, Claim waits for it:
// then it sees a duplicate if that transaction commits and claims the key
// if it rolls back.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte) (Claim, error) {
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return Claim{}, err
	}
	return s.insert(ctx, tx, s.sql.claim, k, 1, nil)
}

// BeginClaim begins a transaction on the Store's handle and claims key in
// it as [Store.Claim] does, in one round trip: the BEGIN travels with the
// claim. It is the fast path for callers that start a transaction per
// message. Unless the error is other than nil or a *ConflictError, the
// caller owns tx and must commit or roll it back.
func (s *Store) BeginClaim(ctx context.Context, scope, key string, fingerprint []byte) (pgx.Tx, Claim, error) {
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return nil, Claim{}, err
	}
	var inserted bool
	b := &pgx.Batch{}
	b.Queue(s.sql.claim, k.args(s.cfg.Retention, 1, nil)...).Exec(func(tag pgconn.CommandTag) error {
		inserted = tag.RowsAffected() == 1
		return nil
	})
	tx, err := pgutil.BeginBatch(ctx, s.db, b)
	if err != nil {
		return nil, Claim{}, fmt.Errorf("inbox: claim %q: %w", key, err)
	}
	if inserted {
		return tx, Claim{New: true}, nil
	}
	c, found, err := s.stored(ctx, tx, k)
	if err == nil && !found {
		c, err = s.insert(ctx, tx, s.sql.claim, k, 1, nil)
	}
	if conflict := (*ConflictError)(nil); err != nil && !errors.As(err, &conflict) {
		return nil, Claim{}, errors.Join(err, tx.Rollback(ctx))
	}
	return tx, c, err
}

// DeadLetter records key in tx as FAILED_FINAL with cause and the number of
// attempts made, so that redeliveries are recognised and not applied. It
// takes over a record whose leased attempt failed retryably; any other
// stored record is kept and reported as by [Store.Claim].
func (s *Store) DeadLetter(ctx context.Context, tx pgx.Tx, scope, key string, fingerprint []byte, attempts int, cause error) (Claim, error) {
	text := "dead letter"
	if cause != nil {
		text = cause.Error()
	}
	k, err := s.resolve(ctx, scope, key, fingerprint)
	if err != nil {
		return Claim{}, err
	}
	return s.insert(ctx, tx, s.sql.deadLetter, k, attempts, &text)
}

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
	return keyArgs{scope: scope, key: key, scopeID: scopeID, id: id, text: text, fingerprint: nonNil(fingerprint)}, nil
}

// args are the arguments of the insertRecord statements.
func (k keyArgs) args(retention time.Duration, attempts int, lastError *string) []any {
	return []any{k.scopeID, k.id, k.fingerprint, k.text, retention, attempts, lastError}
}

// insert runs an insertRecord statement in tx and reports the claim.
func (s *Store) insert(ctx context.Context, tx pgx.Tx, sql string, k keyArgs, attempts int, lastError *string) (Claim, error) {
	for range 2 {
		tag, err := tx.Exec(ctx, sql, k.args(s.cfg.Retention, attempts, lastError)...)
		if err != nil {
			return Claim{}, fmt.Errorf("inbox: claim %q: %w", k.key, err)
		}
		if tag.RowsAffected() == 1 {
			return Claim{New: true}, nil
		}
		c, found, err := s.stored(ctx, tx, k)
		if found || err != nil {
			return c, err
		}
		// Deleted by GC in between: claim it afresh.
	}
	return Claim{}, fmt.Errorf("inbox: claim %q: record vanished twice", k.key)
}

// stored reads the record an insert found, the duplicate path. In a READ
// COMMITTED transaction this new statement sees the record even if it
// committed concurrently, after the insert's snapshot (the insert waited
// for it, then skipped).
func (s *Store) stored(ctx context.Context, db DB, k keyArgs) (c Claim, found bool, err error) {
	var rec storedRecord
	err = db.QueryRow(ctx, s.sql.get, k.scopeID, k.id).Scan(rec.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, false, nil
	}
	if err != nil {
		return Claim{}, false, fmt.Errorf("inbox: read record %q: %w", k.key, err)
	}
	c, err = existing(k.scope, k.key, k.fingerprint, rec.record(k.scope, k.key))
	return c, true, err
}

// existing reports a claim that found a stored record.
func existing(scope, key string, fingerprint []byte, r Record) (Claim, error) {
	c := Claim{Existing: &r}
	if string(r.Fingerprint) != string(fingerprint) {
		c.Err = &ConflictError{Key: key, Fingerprint: fingerprint, Stored: r}
	}
	return c, c.Err
}

// ClaimBatch claims every item in tx with one statement, like [Store.Claim]
// for each. Keys must be distinct. The result has one Claim per item, in
// order; an invalid key or a conflict is reported in that Claim's Err, not
// as the error, which is reserved for failures of the whole batch.
func (s *Store) ClaimBatch(ctx context.Context, tx pgx.Tx, scope string, items []Item) ([]Claim, error) {
	scopeID, err := s.scopeID(ctx, scope)
	if err != nil {
		return nil, err
	}
	claims := make([]Claim, len(items))
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

	// The duplicate path, read only for keys the insert skipped; a key GC
	// deleted in between is claimed again.
	for range 2 {
		skipped, err := s.claimMissing(ctx, tx, scopeID, ids, fingerprints, texts, index, claims)
		if err != nil || len(skipped) == 0 {
			return claims, err
		}
		rows, err := tx.Query(ctx, s.sql.getBatch, scopeID, skipped)
		if err != nil {
			return nil, fmt.Errorf("inbox: read batch records: %w", err)
		}
		var id uuid.UUID
		var rec storedRecord
		_, err = pgx.ForEachRow(rows, append([]any{&id}, rec.dest()...), func() error {
			i := index[id]
			claims[i], _ = existing(scope, items[i].Key, nonNil(items[i].Fingerprint), rec.record(scope, items[i].Key))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("inbox: read batch records: %w", err)
		}
		ids, fingerprints, texts = unresolved(claims, index, ids, fingerprints, texts)
		if len(ids) == 0 {
			return claims, nil
		}
	}
	return nil, errors.New("inbox: claim batch: records vanished twice")
}

// claimMissing inserts the keys and marks the claimed ones New; it returns
// the ids it skipped because they have a record.
func (s *Store) claimMissing(ctx context.Context, tx pgx.Tx, scopeID int32, ids []uuid.UUID, fingerprints [][]byte, texts []*string, index map[uuid.UUID]int, claims []Claim) ([]uuid.UUID, error) {
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

// unresolved keeps the keys of a batch that neither were claimed nor found.
func unresolved(claims []Claim, index map[uuid.UUID]int, ids []uuid.UUID, fingerprints [][]byte, texts []*string) ([]uuid.UUID, [][]byte, []*string) {
	n := 0
	for k, id := range ids {
		if c := claims[index[id]]; !c.New && c.Existing == nil {
			ids[n], fingerprints[n], texts[n] = id, fingerprints[k], texts[k]
			n++
		}
	}
	return ids[:n], fingerprints[:n], texts[:n]
}

// Unclaim removes the records that ClaimBatch created in tx for keys whose
// messages were not applied after all (their handler failed), so that a
// redelivery applies them. It must only be given keys claimed New in tx.
func (s *Store) Unclaim(ctx context.Context, tx pgx.Tx, scope string, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	scopeID, err := s.scopeID(ctx, scope)
	if err != nil {
		return err
	}
	ids := make([]uuid.UUID, len(keys))
	for i, key := range keys {
		ids[i], _ = keyID(key)
	}
	if _, err := tx.Exec(ctx, s.sql.unclaim, scopeID, ids); err != nil {
		return fmt.Errorf("inbox: unclaim: %w", err)
	}
	return nil
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
	var rec storedRecord
	err = s.db.QueryRow(ctx, s.sql.get, k.scopeID, k.id).Scan(rec.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("inbox: get %q: %w", key, err)
	}
	return rec.record(scope, key), nil
}

// GC deletes records whose retention ran out, batchSize at a time (each
// batch its own short statement, through the expires_at index), until none
// is left, and returns how many it deleted. Records under a live lease are
// kept. batchSize <= 0 means 1000.
func (s *Store) GC(ctx context.Context, batchSize int) (int64, error) {
	if batchSize <= 0 {
		batchSize = 1000
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.sql.gc, batchSize)
		if err != nil {
			return total, fmt.Errorf("inbox: gc: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batchSize) {
			return total, nil
		}
	}
}

// storedRecord scans a record; its nullable columns go through pointers.
type storedRecord struct {
	Record
	attempts         int32
	owner, lastError *string
	leaseUntil       *time.Time
}

// dest lists scan targets in the order of recordColumns.
func (r *storedRecord) dest() []any {
	return []any{&r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt, &r.attempts, &r.Status,
		&r.Fingerprint, &r.owner, &r.leaseUntil, &r.Result, &r.lastError}
}

func (r *storedRecord) record(scope, key string) Record {
	rec := r.Record
	rec.Scope, rec.Key, rec.Attempts = scope, key, int(r.attempts)
	rec.Owner, rec.LeaseUntil, rec.LastError = deref(r.owner), deref(r.leaseUntil), deref(r.lastError)
	return rec
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
