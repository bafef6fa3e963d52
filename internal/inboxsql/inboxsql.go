// Package inboxsql owns the inbox table: its configuration, record,
// statuses, conflict error, every statement and the state machine they
// make, behind one [Store] opened from the table's [Config]. Package inbox
// is its public façade (setup, administration, leases; inbox.Store is
// this Store under another name), package consumer claims keys through
// the inbox.Store it opens, and request/pgstore stands on the lease half.
// The statements are built once per table from validated, quoted
// identifiers; nothing is assembled from user input at run time.
package inboxsql

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
)

// DB is the handle a Store runs on: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type DB = pgutil.DB

// Render fills the placeholders of an inbox statement for table t (the
// request store renders its own statements on the same table with it):
// {{table}}, {{scopes}}, {{conflicts}}, {{columns}}, the statuses and
// {{now_us}}.
func Render(t pgutil.Table) func(string) string {
	return strings.NewReplacer(
		"{{table}}", t.String(),
		"{{scopes}}", t.Ident("_scopes"),
		"{{conflicts}}", t.Ident("_conflicts"),
		"{{columns}}", recordColumns,
		"{{in_progress}}", fmt.Sprint(int16(InProgress)),
		"{{succeeded}}", fmt.Sprint(int16(Succeeded)),
		"{{failed_retryable}}", fmt.Sprint(int16(FailedRetryable)),
		"{{failed_final}}", fmt.Sprint(int16(FailedFinal)),
		"{{now_us}}", "(extract(epoch FROM now()) * 1000000)::bigint",
	).Replace
}

// maxFingerprint bounds a fingerprint: it is a digest, not a payload.
const maxFingerprint = 64

// KeyID maps a key to the uuid the table is keyed by. A canonical UUID
// (lower case, not version 8) is stored as itself and needs no text;
// anything else becomes a version-8 UUID made of its SHA-256, and its text
// is stored beside it. Version 8 is reserved for derived ids so that a
// crafted UUID key can never collide with a derived one.
func KeyID(key string) (id uuid.UUID, text *string) {
	if len(key) == 36 {
		if u, err := uuid.Parse(key); err == nil && u.Version() != 8 && u.String() == key {
			return u, nil
		}
	}
	sum := sha256.Sum256([]byte(key))
	copy(id[:], sum[:16])
	id[6] = id[6]&0x0f | 0x80 // version 8
	id[8] = id[8]&0x3f | 0x80 // RFC 9562 variant
	return id, &key
}

// Store is one inbox table: the claim protocol, the leases, the
// administration's statements and the partitions. It is safe for
// concurrent use.
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
	// layoutOK is set once the table's layout was found to match cfg.
	layoutOK bool
}

// New opens the Store of the inbox table cfg names on db, with cfg's
// defaults filled in; component names the caller's package in
// configuration errors. It runs no statement.
func New(db DB, cfg Config, component string) (*Store, error) {
	if pgtx.IsNil(db) {
		return nil, idemq.NewConfigError(component, "db", "is nil; pass a *pgxpool.Pool")
	}
	cfg, err := cfg.resolved(component)
	if err != nil {
		return nil, err
	}
	table, err := pgutil.ConfigTable(component, cfg.Schema, cfg.Table)
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
	return &Store{db: db, cfg: cfg, table: table, sql: sql, connCheck: connCheck(db, cfg.ConnectionCheckInterval), scopes: map[string]int32{}}, nil
}

// Config returns the configuration with its defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// DB returns the handle the Store runs its own statements on.
func (s *Store) DB() DB { return s.db }

// connCheck returns the client_connection_check_interval a Store sets, in
// milliseconds, or "" when it is disabled or db's connections set their
// own.
func connCheck(db DB, interval time.Duration) string {
	if interval < 0 {
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
	return strconv.FormatInt(interval.Milliseconds(), 10)
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

// RegisterScope makes sure scope has its id, so that claims of the scope
// inside a transaction need no second connection. Claims register an
// unknown scope themselves on the Store's own handle; call RegisterScope
// first when that handle is a pool that the transaction may exhaust.
func (s *Store) RegisterScope(ctx context.Context, scope string) error {
	_, err := s.lookupScope(ctx, scope)
	return err
}

// lookupScope returns the small integer that stands for scope in the inbox
// table, registering the scope on first use. It runs on the Store's own
// handle, never inside a caller's transaction, so a rollback there cannot
// undo a registration another process already relies on.
func (s *Store) lookupScope(ctx context.Context, scope string) (int32, error) {
	s.mu.RLock()
	id, ok := s.scopes[scope]
	s.mu.RUnlock()
	if ok {
		return id, nil
	}
	if scope == "" || len(scope) > 200 {
		return 0, fmt.Errorf("inbox: scope must be 1 to 200 bytes, got %d", len(scope))
	}
	if err := s.checkLayout(ctx); err != nil {
		return 0, err
	}
	// The insert skips a concurrent registration without seeing it; the
	// next statement's snapshot does.
	for range 2 {
		err := s.db.QueryRow(ctx, s.sql.registerScope, scope).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("inbox: register scope %q: %w", scope, NotMigrated(err))
		}
		s.mu.Lock()
		s.scopes[scope] = id
		s.mu.Unlock()
		return id, nil
	}
	return 0, fmt.Errorf("inbox: register scope %q: not visible after insert", scope)
}

// Validate reports whether key and fingerprint are acceptable:
// ErrInvalidKey for an empty key, one over MaxKeyLen bytes, or one that is
// not valid UTF-8 or contains NUL, or one PartitionByKey cannot place
// (see checkPartitionKey); an error for a fingerprint over 64 bytes.
func (s *Store) Validate(key string, fingerprint []byte) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > s.cfg.MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrInvalidKey, len(key), s.cfg.MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8 text", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains NUL at byte %d, which Postgres text cannot hold", ErrInvalidKey, strings.IndexByte(key, 0))
	case len(fingerprint) > maxFingerprint:
		return fmt.Errorf("inbox: fingerprint of %d bytes, want a digest of at most %d", len(fingerprint), maxFingerprint)
	}
	if s.cfg.Partitioning == PartitionByKey {
		return s.checkPartitionKey(KeyID(key))
	}
	return nil
}

// Key is a validated key with everything its statements need.
type Key struct {
	Scope, Key  string
	ScopeID     int32
	ID          uuid.UUID
	Text        *string
	Fingerprint []byte
}

// Resolve validates key and fingerprint and finds the scope's id.
func (s *Store) Resolve(ctx context.Context, scope, key string, fingerprint []byte) (Key, error) {
	if err := s.Validate(key, fingerprint); err != nil {
		return Key{}, err
	}
	scopeID, err := s.lookupScope(ctx, scope)
	if err != nil {
		return Key{}, err
	}
	id, text := KeyID(key)
	return Key{Scope: scope, Key: key, ScopeID: scopeID, ID: id, Text: text, Fingerprint: nonNil(fingerprint)}, nil
}

// Args are the first arguments of the statements that insert a record:
// scope, key id, fingerprint, key text, retention.
func (k Key) Args(retention time.Duration) []any {
	return []any{k.ScopeID, k.ID, k.Fingerprint, k.Text, retention}
}

// storedRecord reads the record of k on db. In a READ COMMITTED transaction
// this new statement sees the record even if it committed concurrently,
// after an insert's snapshot (the insert waited for it, then skipped).
func (s *Store) storedRecord(ctx context.Context, db DB, k Key) (Record, bool, error) {
	var rec Scan
	err := db.QueryRow(ctx, s.sql.get, k.ScopeID, k.ID).Scan(rec.Dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("inbox: read record %q: %w", k.Key, err)
	}
	return rec.Record(k.Scope, k.Key), true, nil
}

// against returns rec as a claim of key with fingerprint sees it: rec
// itself when the fingerprints match; a duplicate (Succeeded, with that
// fingerprint and no stored result) when the key was applied with it
// before a released conflict; otherwise rec and a *ConflictError.
func (s *Store) against(rec Record, key string, fingerprint []byte) (Record, error) {
	same := func(f []byte) bool { return string(f) == string(fingerprint) }
	switch {
	case same(rec.Fingerprint):
		return rec, nil
	case slices.ContainsFunc(rec.Superseded, same):
		rec.Status, rec.Fingerprint, rec.Result, rec.Owner, rec.LeaseUntil = Succeeded, fingerprint, nil, "", time.Time{}
		return rec, nil
	}
	return rec, &ConflictError{Key: key, Fingerprint: fingerprint, Stored: rec}
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
