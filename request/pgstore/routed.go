package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/request"
)

// ErrNoTenant reports a request whose context names no tenant database
// (see request.WithTenant) to a Routed store.
var ErrNoTenant = errors.New("pgstore: the request's context names no tenant database (request.WithTenant)")

// Routed is a [request.Store] that keeps each request's record in the
// database of its tenant, named in the request's context by
// request.WithTenant, among those a fleet.Source lists: the record and the
// handler's writes live in the same database, as with one Store. Pools
// are opened on a tenant's first request, within each server's connection
// budget (fleet.Pools). A request without a tenant, or whose tenant the
// Source does not list, fails like a store that cannot be reached (the
// middleware answers 503): resolve and check tenants before the
// middleware.
type Routed struct {
	pools *fleet.Pools[*Store]
	cfg   Config
}

// NewRouted returns a store that routes each request to its tenant's
// database, each with a Store of cfg.
func NewRouted(src fleet.Source, cfg Config, pools fleet.PoolsConfig) (*Routed, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p, err := fleet.NewPools(src, pools, func(_ fleet.Database, pool *pgxpool.Pool) (*Store, error) { return New(pool, cfg) })
	if err != nil {
		return nil, err
	}
	return &Routed{pools: p, cfg: cfg}, nil
}

// Tenant returns the Store of one tenant database, for CompleteTx in the
// handler's transaction, GC and inspection.
func (r *Routed) Tenant(ctx context.Context, name string) (*Store, error) {
	s, release, err := r.pools.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	release()
	return s, nil
}

// with runs fn on the Store of ctx's tenant, held meanwhile.
func (r *Routed) with(ctx context.Context, fn func(*Store) error) error {
	name, ok := request.Tenant(ctx)
	if !ok {
		return ErrNoTenant
	}
	s, release, err := r.pools.Get(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	return fn(s)
}

// Claim claims id in the tenant's database; see [request.Store].
func (r *Routed) Claim(ctx context.Context, id request.ID, fingerprint []byte, lease time.Duration) (c request.Claim, err error) {
	err = r.with(ctx, func(s *Store) error { c, err = s.Claim(ctx, id, fingerprint, lease); return err })
	return c, err
}

// Complete stores resp in the tenant's database; see [request.Store].
func (r *Routed) Complete(ctx context.Context, lease idemq.Lease, resp request.Response) error {
	return r.with(ctx, func(s *Store) error { return s.Complete(ctx, lease, resp) })
}

// Release ends lease's attempt in the tenant's database; see [request.Store].
func (r *Routed) Release(ctx context.Context, lease idemq.Lease) error {
	return r.with(ctx, func(s *Store) error { return s.Release(ctx, lease) })
}

// Extend extends lease in the tenant's database; see [request.Store].
func (r *Routed) Extend(ctx context.Context, lease idemq.Lease, d time.Duration) (l idemq.Lease, err error) {
	err = r.with(ctx, func(s *Store) error { l, err = s.Extend(ctx, lease, d); return err })
	return l, err
}

// Get returns the record of id in the tenant's database; see
// [request.Store].
func (r *Routed) Get(ctx context.Context, id request.ID) (rec request.Record, err error) {
	err = r.with(ctx, func(s *Store) error { rec, err = s.Get(ctx, id); return err })
	return rec, err
}

// RecordTTL is the record TTL of every tenant's Store.
func (r *Routed) RecordTTL() time.Duration { return r.cfg.RecordTTL }

// Migrate creates or upgrades the request table of every database the
// Source lists, four at a time, and reports every failure.
func (r *Routed) Migrate(ctx context.Context) error {
	return r.pools.Each(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		s, err := New(conn, r.cfg)
		if err != nil {
			return err
		}
		return s.Migrate(ctx)
	})
}
