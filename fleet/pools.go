package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/nilcheck"
)

// ErrUnknown reports a database name the Source does not list, even after
// reading it again.
var ErrUnknown = errors.New("fleet: no such database in the fleet")

// ErrBudget reports a server whose connection budget is held by other
// databases' work in flight: retry later.
var ErrBudget = errors.New("fleet: the server's connection budget is in use")

// PoolsConfig configures [Pools].
type PoolsConfig struct {
	// ConnsPerServer is the most connections the pools hold on one
	// server, all databases together. Defaults to 20.
	ConnsPerServer int
	// ConnsPerDatabase is the size of each database's pool. Defaults to 4.
	ConnsPerDatabase int
	// Reload is the least time between two reads of the Source: it is
	// read again when a name it did not list is asked for (a tenant
	// added), at most this often. Defaults to 5 seconds.
	Reload time.Duration
}

// Pools opens a pool per database on demand, for work routed to a
// tenant's database (a consumer's message, a request), and keeps each
// server within its connection budget: when a server's budget is spent,
// the least recently used pool of that server with nothing in flight is
// closed to make room. Each open pool carries a value built once from it
// (the tenant's consumer or store). A database the Source stops listing
// is closed once idle.
type Pools[T any] struct {
	src    Source
	cfg    PoolsConfig
	open   func(Database, *pgxpool.Pool) (T, error)
	budget *Budget

	readMu sync.Mutex // one read of the Source at a time
	mu     sync.Mutex
	known  map[string]Database // from the last read
	read   time.Time
	pools  map[string]*pooled[T]
}

// pooled is one open database.
type pooled[T any] struct {
	db     Database
	server string
	pool   *pgxpool.Pool
	value  T
	used   time.Time
	busy   int
}

// NewPools returns pools of the databases src lists; open builds each
// pool's value when the pool opens.
func NewPools[T any](src Source, cfg PoolsConfig, open func(Database, *pgxpool.Pool) (T, error)) (*Pools[T], error) {
	if nilcheck.IsNil(src) {
		return nil, idemq.NewConfigError("fleet", "source", "is nil")
	}
	if open == nil {
		return nil, idemq.NewConfigError("fleet", "open", "is nil")
	}
	cfg.ConnsPerServer = cmp.Or(cfg.ConnsPerServer, 20)
	cfg.ConnsPerDatabase = cmp.Or(cfg.ConnsPerDatabase, 4)
	cfg.Reload = cmp.Or(cfg.Reload, 5*time.Second)
	if cfg.ConnsPerDatabase < 1 || cfg.ConnsPerServer < cfg.ConnsPerDatabase {
		return nil, idemq.NewConfigError("fleet", "ConnsPerServer", "%d cannot hold one pool of ConnsPerDatabase %d", cfg.ConnsPerServer, cfg.ConnsPerDatabase)
	}
	budget, err := NewBudget(cfg.ConnsPerServer)
	if err != nil {
		return nil, err
	}
	return &Pools[T]{src: src, cfg: cfg, open: open, budget: budget, pools: map[string]*pooled[T]{}}, nil
}

// Databases returns the databases of the Source, read again if the last
// read is older than Reload.
func (p *Pools[T]) Databases(ctx context.Context) ([]Database, error) {
	if _, err := p.lookup(ctx, ""); err != nil && !errors.Is(err, ErrUnknown) {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	dbs := make([]Database, 0, len(p.known))
	for _, d := range p.known {
		dbs = append(dbs, d)
	}
	return dbs, nil
}

// Get returns the value of the database named name, opening its pool if
// needed, and a func that ends the hold on it: a pool is never closed
// while held. It fails with [ErrUnknown] when the Source does not list
// name, and [ErrBudget] when every connection of its server is held.
func (p *Pools[T]) Get(ctx context.Context, name string) (value T, release func(), err error) {
	db, err := p.lookup(ctx, name)
	if err != nil {
		return value, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pd, ok := p.pools[name]
	if !ok || pd.db.ConnString != db.ConnString {
		if pd, err = p.openLocked(db); err != nil {
			return value, nil, err
		}
	}
	pd.busy++
	pd.used = time.Now()
	return pd.value, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		pd.busy--
	}, nil
}

// lookup returns the database named name, reading the Source again (at
// most every Reload) when it does not list it.
func (p *Pools[T]) lookup(ctx context.Context, name string) (Database, error) {
	p.mu.Lock()
	db, ok := p.known[name]
	fresh := p.known != nil && time.Since(p.read) < p.cfg.Reload
	p.mu.Unlock()
	if ok {
		return db, nil
	}
	if !fresh {
		p.readMu.Lock()
		defer p.readMu.Unlock()
		p.mu.Lock()
		fresh = p.known != nil && time.Since(p.read) < p.cfg.Reload
		p.mu.Unlock()
		if !fresh {
			if err := p.reload(ctx); err != nil {
				return Database{}, err
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if db, ok := p.known[name]; ok {
		return db, nil
	}
	return Database{}, fmt.Errorf("%w: %q", ErrUnknown, name)
}

// reload reads the Source and closes the idle pools of databases it no
// longer lists (or lists with another connection string).
func (p *Pools[T]) reload(ctx context.Context) error {
	dbs, err := p.src.Databases(ctx)
	if err != nil {
		return err
	}
	known := make(map[string]Database, len(dbs))
	for _, d := range dbs {
		known[d.Name] = d
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.known, p.read = known, time.Now()
	for name, pd := range p.pools {
		if d, ok := known[name]; (!ok || d.ConnString != pd.db.ConnString) && pd.busy == 0 {
			p.closeLocked(pd)
		}
	}
	return nil
}

// openLocked opens db's pool within its server's budget, closing the
// least recently used idle pools of the server to make room.
func (p *Pools[T]) openLocked(db Database) (*pooled[T], error) {
	server, err := db.Server()
	if err != nil {
		return nil, err
	}
	if old, ok := p.pools[db.Name]; ok && old.busy == 0 { // moved
		p.closeLocked(old)
	}
	for !p.budget.TryReserve(server, p.cfg.ConnsPerDatabase) {
		if !p.evictLocked(server) {
			return nil, fmt.Errorf("%w: %s (%d connections)", ErrBudget, server, p.cfg.ConnsPerServer)
		}
	}
	pd, err := p.connect(db, server)
	if err != nil {
		p.budget.Release(server, p.cfg.ConnsPerDatabase)
		return nil, err
	}
	p.pools[db.Name] = pd
	return pd, nil
}

// connect builds db's pool (it connects on first use) and its value.
func (p *Pools[T]) connect(db Database, server string) (*pooled[T], error) {
	cfg, err := pgxpool.ParseConfig(db.ConnString)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = int32(p.cfg.ConnsPerDatabase), 0, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	value, err := p.open(db, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &pooled[T]{db: db, server: server, pool: pool, value: value}, nil
}

// evictLocked closes the least recently used idle pool of server and
// reports whether there was one.
func (p *Pools[T]) evictLocked(server string) bool {
	var lru *pooled[T]
	for _, pd := range p.pools {
		if pd.server == server && pd.busy == 0 && (lru == nil || pd.used.Before(lru.used)) {
			lru = pd
		}
	}
	if lru != nil {
		p.closeLocked(lru)
	}
	return lru != nil
}

func (p *Pools[T]) closeLocked(pd *pooled[T]) {
	delete(p.pools, pd.db.Name)
	pd.pool.Close()
	p.budget.Release(pd.server, p.cfg.ConnsPerDatabase)
}

// Each runs fn on every database of the Source, four at a time, each on
// a connection of its own (see the package func Each), and returns every
// failure joined, named by its database: what migrating every tenant
// needs.
func (p *Pools[T]) Each(ctx context.Context, fn func(ctx context.Context, conn *pgx.Conn) error) error {
	dbs, err := p.Databases(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range Each(ctx, dbs, 4, func(ctx context.Context, _ Database, conn *pgx.Conn) error { return fn(ctx, conn) }) {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Database.Name, r.Err))
		}
	}
	return errors.Join(errs...)
}

// InUse returns the connections the pools may hold on server.
func (p *Pools[T]) InUse(server string) int { return p.budget.InUse(server) }

// Close closes every pool.
func (p *Pools[T]) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pd := range p.pools {
		p.closeLocked(pd)
	}
}
