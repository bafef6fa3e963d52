// Package inboxsql is the inbox's claim protocol and the statements,
// record columns and key rules it shares with package inbox, for the two
// packages that use them: inbox (setup, administration, leases) and
// consumer (claims), as internal/outboxsql serves outbox and relay. A
// column, a status or a key rule changes here, once. The statements are
// built once per table from validated, quoted identifiers; nothing is
// assembled from user input at run time.
//
// A [Store] is opened by each of the two packages on the same handle and
// table; each keeps its own cache of scope ids, which are never reused.
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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/errtext"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
)

// DB is the handle a Store runs on; inbox.DB has the same method set.
type DB = pgutil.DB

// Status is where a record stands; package inbox documents it as
// inbox.Status.
type Status int16

// The statuses, as stored.
const (
	InProgress      Status = 1
	Succeeded       Status = 2
	FailedRetryable Status = 3
	FailedFinal     Status = 4
)

func (s Status) String() string {
	switch s {
	case InProgress:
		return "IN_PROGRESS"
	case Succeeded:
		return "SUCCEEDED"
	case FailedRetryable:
		return "FAILED_RETRYABLE"
	case FailedFinal:
		return "FAILED_FINAL"
	}
	return fmt.Sprintf("Status(%d)", int16(s))
}

// Row is the stored state of one (scope, key). Its fields are inbox.Record's,
// in the same order, so that inbox.Record(row) converts it.
type Row struct {
	Scope       string
	Key         string
	Fingerprint []byte
	Status      Status
	Owner       string
	LeaseUntil  time.Time
	Attempts    int
	Token       int64
	Failures    int
	Result      []byte
	LastError   string
	ErrorClass  string
	Superseded  [][]byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
	ExpiresAt   time.Time
}

// Columns are the stored columns a Row is read from, in the order of
// [Scan.Dest], for the table aliased r.
const Columns = `r.created_at, r.updated_at, r.expires_at, r.attempts, r.failures, r.status,
	r.fingerprint, r.owner, r.lease_until, r.result, r.last_error, r.superseded, r.token`

// Scan scans the [Columns] of a record; its nullable columns go through
// pointers.
type Scan struct {
	row              Row
	attempts         int32
	failures         int32
	token            *int64
	owner, lastError *string
	leaseUntil       *time.Time
}

// Dest lists scan targets in the order of Columns.
func (r *Scan) Dest() []any {
	return []any{&r.row.CreatedAt, &r.row.UpdatedAt, &r.row.ExpiresAt, &r.attempts, &r.failures, &r.row.Status,
		&r.row.Fingerprint, &r.owner, &r.leaseUntil, &r.row.Result, &r.lastError, &r.row.Superseded, &r.token}
}

// Row returns the scanned record of (scope, key).
func (r *Scan) Row(scope, key string) Row {
	row := r.row
	row.Scope, row.Key, row.Attempts, row.Failures = scope, key, int(r.attempts), int(r.failures)
	row.Owner, row.LeaseUntil, row.LastError = deref(r.owner), deref(r.leaseUntil), deref(r.lastError)
	row.Token = deref(r.token)
	return row
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Render fills the placeholders of an inbox statement for table t:
// {{table}}, {{scopes}}, {{conflicts}}, {{columns}}, the statuses and
// {{now_us}}.
func Render(t pgutil.Table) func(string) string {
	return strings.NewReplacer(
		"{{table}}", t.String(),
		"{{scopes}}", t.Ident("_scopes"),
		"{{conflicts}}", t.Ident("_conflicts"),
		"{{columns}}", Columns,
		"{{in_progress}}", fmt.Sprint(int16(InProgress)),
		"{{succeeded}}", fmt.Sprint(int16(Succeeded)),
		"{{failed_retryable}}", fmt.Sprint(int16(FailedRetryable)),
		"{{failed_final}}", fmt.Sprint(int16(FailedFinal)),
		"{{now_us}}", "(extract(epoch FROM now()) * 1000000)::bigint",
	).Replace
}

var (
	// ErrInvalidKey is inbox.ErrInvalidKey.
	ErrInvalidKey = errors.New("inbox: invalid key")
	// ErrNotMigrated is inbox.ErrNotMigrated.
	ErrNotMigrated = errors.New("inbox: the inbox tables are missing or out of date: run `idemq migrate` or Store.Migrate (consumer.Consumer.Migrate) first")
	// ErrNilTx reports a nil transaction passed to a Tx method.
	ErrNilTx error = idemq.NewConfigError("inbox", "tx", "is nil: pass the caller's transaction, or use the call without Tx")
)

// NotMigrated marks err with ErrNotMigrated when Postgres reports an
// undefined table (42P01) or column (42703).
func NotMigrated(err error) error {
	if pg := (*pgconn.PgError)(nil); errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703") {
		return fmt.Errorf("%w: %w", ErrNotMigrated, err)
	}
	return err
}

// ErrText is the stored text of a failure's cause.
func ErrText(cause error) string { return errtext.Of(cause) }

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

// Options configures a Store: inbox.Config with its defaults filled in,
// and the error a conflict becomes.
type Options struct {
	Schema, Table           string
	MaxKeyLen               int
	Retention               time.Duration
	ConnectionCheckInterval time.Duration // negative: disabled
	// Conflict returns the error of a key seen before with another
	// fingerprint (an *inbox.ConflictError).
	Conflict func(key string, fingerprint []byte, stored Row) error
	// Partitioning, PartitionInterval and BoundaryGrace are the inbox's
	// partitioned layout (see partition.go and inbox.Config).
	Partitioning      Partitioning
	PartitionInterval time.Duration
	BoundaryGrace     time.Duration
}

// Store runs the claim protocol and the shared record reads on one inbox
// table. It is safe for concurrent use.
type Store struct {
	db   DB
	opts Options
	sql  queries
	// connCheck is the client_connection_check_interval to set in the
	// transactions the Store begins, "" for none.
	connCheck string

	mu     sync.RWMutex
	scopes map[string]int32
}

// New returns a Store on db; the caller has validated opts.
func New(db DB, opts Options) (*Store, error) {
	table, err := pgutil.ConfigTable("inbox", opts.Schema, opts.Table)
	if err != nil {
		return nil, err
	}
	sql := newQueries(table)
	if opts.Partitioning != Unpartitioned {
		partitionQueries(&sql, table.String(), opts)
	}
	return &Store{db: db, opts: opts, sql: sql, connCheck: connCheck(db, opts.ConnectionCheckInterval), scopes: map[string]int32{}}, nil
}

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
	_, err := s.ScopeID(ctx, scope)
	return err
}

// ScopeID returns the small integer that stands for scope in the inbox
// table, registering the scope on first use. It runs on the Store's own
// handle, never inside a caller's transaction, so a rollback there cannot
// undo a registration another process already relies on.
func (s *Store) ScopeID(ctx context.Context, scope string) (int32, error) {
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
// not valid UTF-8 or contains NUL; an error for a fingerprint over 64
// bytes.
func (s *Store) Validate(key string, fingerprint []byte) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > s.opts.MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrInvalidKey, len(key), s.opts.MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8 text", ErrInvalidKey)
	case strings.IndexByte(key, 0) >= 0:
		return fmt.Errorf("%w: contains NUL at byte %d, which Postgres text cannot hold", ErrInvalidKey, strings.IndexByte(key, 0))
	case len(fingerprint) > maxFingerprint:
		return fmt.Errorf("inbox: fingerprint of %d bytes, want a digest of at most %d", len(fingerprint), maxFingerprint)
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
	scopeID, err := s.ScopeID(ctx, scope)
	if err != nil {
		return Key{}, err
	}
	id, text := KeyID(key)
	if err := s.checkPartitionKey(id, text); err != nil {
		return Key{}, err
	}
	return Key{Scope: scope, Key: key, ScopeID: scopeID, ID: id, Text: text, Fingerprint: nonNil(fingerprint)}, nil
}

// Args are the first arguments of the statements that insert a record:
// scope, key id, fingerprint, key text, retention.
func (k Key) Args(retention time.Duration) []any {
	return []any{k.ScopeID, k.ID, k.Fingerprint, k.Text, retention}
}

// Stored reads the record of k on db. In a READ COMMITTED transaction
// this new statement sees the record even if it committed concurrently,
// after an insert's snapshot (the insert waited for it, then skipped).
func (s *Store) Stored(ctx context.Context, db DB, k Key) (Row, bool, error) {
	var rec Scan
	err := db.QueryRow(ctx, s.sql.get, k.ScopeID, k.ID).Scan(rec.Dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("inbox: read record %q: %w", k.Key, err)
	}
	return rec.Row(k.Scope, k.Key), true, nil
}

// Against returns rec as a claim of key with fingerprint sees it: rec
// itself when the fingerprints match; a duplicate (Succeeded, with that
// fingerprint and no stored result) when the key was applied with it
// before a released conflict; otherwise rec and the Options' conflict
// error.
func (s *Store) Against(rec Row, key string, fingerprint []byte) (Row, error) {
	same := func(f []byte) bool { return string(f) == string(fingerprint) }
	switch {
	case same(rec.Fingerprint):
		return rec, nil
	case slices.ContainsFunc(rec.Superseded, same):
		rec.Status, rec.Fingerprint, rec.Result, rec.Owner, rec.LeaseUntil = Succeeded, fingerprint, nil, "", time.Time{}
		return rec, nil
	}
	return rec, s.opts.Conflict(key, fingerprint, rec)
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
