// Package pgstore keeps request records in Postgres, the durable default
// of package request: the leased mode of the inbox table (its lease half,
// shared with package inbox) in a table of its own.
//
// A claim is one INSERT … ON CONFLICT DO UPDATE that takes a new, released
// or expired key and sets its fencing token to the larger of the previous
// token + 1 and the database clock in microseconds, so that a key whose
// record GC deleted never hands out a smaller token, and commits without
// waiting for its WAL flush (see [Config.SynchronousClaims]); Complete, Release
// and Extend are UPDATEs that compare that token. [Store.CompleteTx] completes inside
// the caller's transaction, so that a handler's writes and the request's
// record commit together: if the key was taken over meanwhile, CompleteTx
// fails and the caller rolls back, so the stale attempt's writes never
// land. [Store.BeginTx] is the transaction-owning mode
// (request.TxStore): the front end's transaction claims the key with its
// BEGIN, the handler writes in it ([Tx]), and the response is stored with
// its COMMIT.
//
// Records are kept for at least [Config.RecordTTL]; [Store.GC] deletes
// expired ones in bounded batches (run it from a periodic job).
package pgstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/request"
)

// DB is the database handle a Store runs on: a *pgxpool.Pool (the usual
// choice), a *pgx.Conn or a pgx.Tx all satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Store. The zero value is valid.
type Config struct {
	// Schema holds the table. Defaults to "public".
	Schema string
	// Table names the records table (and Table + "_scopes"). Keep it apart
	// from the consumers' inbox, whose records live longer. Defaults to
	// "idemq_requests".
	Table string
	// RecordTTL is how long a record is kept after its last change.
	// Defaults to request.RecordTTLDefault (24 hours).
	RecordTTL time.Duration
	// SynchronousClaims makes a claim wait until its WAL is on disk. By
	// default claims commit with synchronous_commit off (as
	// inbox.Config.AsyncAcquire does): a claim then costs no flush of its own,
	// and the durable commit that completes the request (Complete, or
	// CompleteTx in the handler's transaction) flushes it too. What the
	// default gives up: a Postgres crash within a fraction of a second
	// after a claim may forget it, so a retry that arrives while the
	// first attempt is still running is served instead of answered 409,
	// and the first attempt's completion is then fenced out. With
	// CompleteTx nothing is lost, since the first attempt's transaction
	// cannot commit; a handler with effects outside Postgres may run them
	// twice. Set it where that window must be closed. Defaults to false.
	SynchronousClaims bool
}

// TableDefault is the default Config.Table.
const TableDefault = "idemq_requests"

const component = "pgstore"

func (c Config) withDefaults() Config {
	c.Table = cmp.Or(c.Table, TableDefault)
	c.RecordTTL = cmp.Or(c.RecordTTL, request.RecordTTLDefault)
	return c
}

func (c Config) validate() error {
	if c.RecordTTL < time.Second {
		return idemq.NewConfigError(component, "RecordTTL", "%v is below one second", c.RecordTTL)
	}
	return nil
}

// Store is a [request.Store] on Postgres. It is safe for concurrent use.
type Store struct {
	in    *inboxsql.Store
	ttl   time.Duration
	owner string
	// db and owned serve the transaction-owning mode (owned.go).
	db    DB
	owned ownedSQL
}

var _ request.Store = (*Store)(nil)

// New returns a Store on db (a *pgxpool.Pool); call [Store.Migrate] once
// before use.
func New(db DB, cfg Config) (*Store, error) {
	if pgtx.IsNil(db) {
		return nil, idemq.NewConfigError(component, "db", "is nil (%T); pass a *pgxpool.Pool", db)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	in, err := inboxsql.New(db, inboxsql.Config{Schema: cfg.Schema, Table: cfg.Table, Retention: cfg.RecordTTL, MaxKeyLen: 1024, AsyncAcquire: !cfg.SynchronousClaims}, component)
	if err != nil {
		return nil, err
	}
	ic := in.Config() // with its defaults
	table, err := pgutil.ConfigTable(component, ic.Schema, ic.Table)
	if err != nil {
		return nil, err
	}
	var owner [6]byte
	_, _ = rand.Read(owner[:])
	return &Store{in: in, ttl: cfg.RecordTTL, owner: hex.EncodeToString(owner[:]), db: db, owned: newOwnedSQL(table)}, nil
}

// Migrate creates or upgrades the table. It is idempotent and safe to run
// from several processes at once.
func (s *Store) Migrate(ctx context.Context) error { return s.in.Migrate(ctx) }

// PendingMigrations returns the migrations Migrate would apply, in order;
// none once the table is up to date.
func (s *Store) PendingMigrations(ctx context.Context) ([]migrate.Migration, error) {
	return s.in.PendingMigrations(ctx)
}

// MigrationSource implements [migrate.Store]: the records table is an
// inbox table, with the inbox's migrations.
func (s *Store) MigrationSource() migrate.Source { return s.in.MigrationSource() }

// RecordTTL returns Config.RecordTTL.
func (s *Store) RecordTTL() time.Duration { return s.ttl }

// scopePrefix starts the inbox scope of every request scope, which may
// be empty where an inbox scope may not.
const scopePrefix = "r:"

// scope maps a request scope to an inbox scope.
func scope(id request.ID) string { return scopePrefix + id.Scope }

// Claim implements [request.Store.Claim].
func (s *Store) Claim(ctx context.Context, id request.ID, fingerprint []byte, lease time.Duration) (request.Claim, error) {
	c, err := s.in.Acquire(ctx, scope(id), id.Key, fingerprint, s.owner, lease)
	var conflict *inboxsql.ConflictError
	switch {
	case errors.As(err, &conflict):
		stored, _ := record(id, conflict.Stored)
		return request.Claim{}, &request.ConflictError{ID: id, Fingerprint: fingerprint, Stored: stored}
	case errors.Is(err, inboxsql.ErrInvalidKey):
		return request.Claim{}, fmt.Errorf("%w: %w", request.ErrInvalidKey, err)
	case err != nil:
		return request.Claim{}, err
	case c.New:
		return request.Claim{Acquired: true, Lease: idemq.Lease{Scope: id.Scope, Key: id.Key, Token: c.Lease.Token, Until: c.Lease.Until}}, nil
	}
	rec, err := record(id, *c.Existing)
	return request.Claim{Record: rec}, err
}

// Complete implements [request.Store.Complete].
func (s *Store) Complete(ctx context.Context, lease idemq.Lease, resp request.Response) error {
	body, err := resp.MarshalBinary()
	if err != nil {
		return err
	}
	return s.in.Complete(ctx, inboxLease(lease), body)
}

// CompleteTx is [Store.Complete] in the caller's transaction tx: the
// record completes if and only if tx commits. It returns
// idemq.ErrLeaseLost when the key was taken over; roll tx back then, so
// that the stale attempt's writes are undone and the successor's stand.
// Until tx ends, the record's row stays locked: a concurrent claim of the
// key waits for it. A nil tx is refused (idemq.ErrConfig): use
// [Store.Complete] for a transaction of its own.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, lease idemq.Lease, resp request.Response) error {
	if pgtx.IsNil(tx) {
		// Completing in a transaction of its own instead would store the
		// response whether or not the caller's work commits.
		return idemq.NewConfigError("pgstore", "tx", "is nil: pass the transaction of the handler's work, or use Complete")
	}
	body, err := resp.MarshalBinary()
	if err != nil {
		return err
	}
	return s.in.CompleteTx(ctx, tx, inboxLease(lease), body)
}

var errReleased = errors.New("released by the front end")

// Release implements [request.Store.Release].
func (s *Store) Release(ctx context.Context, lease idemq.Lease) error {
	return s.in.Fail(ctx, inboxLease(lease), errReleased)
}

// Extend implements [request.Store.Extend].
func (s *Store) Extend(ctx context.Context, lease idemq.Lease, d time.Duration) (idemq.Lease, error) {
	l, err := s.in.Extend(ctx, inboxLease(lease), d)
	lease.Until = l.Until
	return lease, err
}

// Get implements [request.Store.Get].
func (s *Store) Get(ctx context.Context, id request.ID) (request.Record, error) {
	r, err := s.in.Get(ctx, scope(id), id.Key)
	if errors.Is(err, inboxsql.ErrNotFound) {
		return request.Record{}, request.ErrNotFound
	}
	if err != nil {
		return request.Record{}, err
	}
	return record(id, r)
}

// GC deletes expired records, batchSize at a time (<= 0 means 1000), and
// returns how many it deleted. Records under a live lease are kept.
func (s *Store) GC(ctx context.Context, batchSize int) (int64, error) {
	return s.in.GC(ctx, batchSize)
}

// inboxLease maps a request lease to the inbox lease it stands for.
func inboxLease(l idemq.Lease) idemq.Lease {
	l.Scope = scope(request.ID{Scope: l.Scope, Key: l.Key})
	return l
}

// record translates an inbox record; the request states are the inbox's
// leased states under other names.
func record(id request.ID, r inboxsql.Record) (request.Record, error) {
	rec := request.Record{ID: id, Fingerprint: r.Fingerprint, Token: r.Token, ExpiresAt: r.ExpiresAt}
	switch r.Status {
	case inboxsql.InProgress:
		rec.State, rec.LeaseUntil = request.InProgress, r.LeaseUntil
	case inboxsql.FailedRetryable:
		rec.State = request.Released
	case inboxsql.Succeeded:
		rec.State, rec.Response = request.Completed, &request.Response{}
		if err := rec.Response.UnmarshalBinary(r.Result); err != nil {
			return rec, fmt.Errorf("pgstore: record %q: %w", id.Key, err)
		}
	default:
		return rec, fmt.Errorf("pgstore: record %q has status %s, which request records never take", id.Key, r.Status)
	}
	return rec, nil
}

// Lookup returns the records of request key in every scope (tenant or
// principal), most recently updated first. The operator console's lookup
// page uses it.
func (s *Store) Lookup(ctx context.Context, key string) ([]request.Record, error) {
	recs, err := s.in.Lookup(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make([]request.Record, 0, len(recs))
	for _, r := range recs {
		rec, err := record(request.ID{Scope: strings.TrimPrefix(r.Scope, scopePrefix), Key: key}, r)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// Chores returns the store's maintenance, for an [idemq.Maintenance]: GC
// of expired records every minute, in one process at a time however many
// run it.
func (s *Store) Chores() []idemq.Chore { return []idemq.Chore{s.in.GCChore("requests")} }
