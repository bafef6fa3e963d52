package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/nilcheck"
)

// Route names the database of a message's tenant, one of the names its
// [fleet.Source] lists: from a header, the key or the payload. An error
// makes the message a dead letter.
type Route func(msg *Message) (database string, err error)

// RoutedConfig configures a consumer routed across many databases
// ([NewRouted]).
type RoutedConfig struct {
	// Config configures the consumer of each database.
	Config
	// ConnsPerServer is the most connections the consumer holds on one
	// Postgres server, all its tenants' pools together. Defaults to 20.
	ConnsPerServer int
	// ConnsPerDatabase is the size of each tenant's pool. Defaults to 4.
	ConnsPerDatabase int
	// Reload is the least time between two reads of the Source: it is
	// read again when a message names a database it does not list (a
	// tenant added), at most this often. Defaults to 5 seconds.
	Reload time.Duration
}

// ErrUnknownTenant reports a message whose [Route] names no database of
// the Source, even after reading it again: a dead letter, never retried.
var ErrUnknownTenant = errors.New("consumer: the message's tenant database is not in the fleet")

// NewRouted returns a transactional Consumer that applies each message in
// the database of its tenant: route names the database among those src
// lists, and the handler runs in the transaction that records the message
// in that database's inbox, with that database's writes. One broker
// subscription serves every tenant: pass the Consumer to any subscriber.
//
// Pools are opened on a tenant's first message, within ConnsPerServer per
// server; when a server's budget is spent, the least recently used idle
// pool of that server is closed to make room, and a message that finds
// no room is Retry. ProcessBatch splits a batch by database and keeps each
// message's place. Each database needs the inbox migrated
// ([Consumer.Migrate] migrates them all). [Consumer.Store] is nil: the
// inbox of one tenant is [Consumer.Tenant]'s.
func NewRouted(src fleet.Source, route Route, scope string, handler Handler, cfg RoutedConfig) (*Consumer, error) {
	switch {
	case nilcheck.IsNil(src):
		return nil, idemq.NewConfigError(component, "source", "is nil")
	case route == nil:
		return nil, idemq.NewConfigError(component, "route", "is nil")
	case handler == nil:
		return nil, idemq.NewConfigError(component, "handler", "is nil")
	}
	cfg.ConnsPerServer = cmp.Or(cfg.ConnsPerServer, 20)
	cfg.ConnsPerDatabase = cmp.Or(cfg.ConnsPerDatabase, 4)
	cfg.Reload = cmp.Or(cfg.Reload, 5*time.Second)
	if cfg.ConnsPerDatabase < 1 || cfg.ConnsPerServer < cfg.ConnsPerDatabase {
		return nil, idemq.NewConfigError(component, "ConnsPerServer", "%d cannot hold one tenant's pool of ConnsPerDatabase %d", cfg.ConnsPerServer, cfg.ConnsPerDatabase)
	}
	budget, err := fleet.NewBudget(cfg.ConnsPerServer)
	if err != nil {
		return nil, err
	}
	if scope == "" || len(scope) > maxScope {
		return nil, idemq.NewConfigError(component, "scope", "must be 1 to %d bytes, got %d", maxScope, len(scope))
	}
	cfg.Config = cfg.Config.withDefaults()
	if err := cfg.Config.validate(); err != nil {
		return nil, err
	}
	// The routed consumer checks keys with the inbox's rules and leaves
	// every statement to its tenants' consumers.
	store, err := inbox.New(noDatabase{}, cfg.Inbox)
	if err != nil {
		return nil, err
	}
	claims, err := newClaims(noDatabase{}, store.Config())
	if err != nil {
		return nil, err
	}
	c := &Consumer{scope: scope, claims: claims, handler: handler, cfg: cfg.Config}
	c.tenants = &tenants{src: src, route: route, scope: scope, handler: handler, cfg: cfg, budget: budget, open: map[string]*tenant{}}
	return c, nil
}

// tenants is the routing state of a consumer made by NewRouted.
type tenants struct {
	src     fleet.Source
	route   Route
	scope   string
	handler Handler
	cfg     RoutedConfig
	budget  *fleet.Budget

	mu     sync.Mutex
	known  map[string]fleet.Database // by name, from the last read
	read   time.Time                 // of the Source
	open   map[string]*tenant        // pools opened, by database name
	readMu sync.Mutex                // one read of the Source at a time
}

// tenant is one database's consumer and pool.
type tenant struct {
	db       fleet.Database
	server   string
	pool     *pgxpool.Pool
	consumer *Consumer
	used     time.Time // last message, for eviction
	busy     int       // messages in flight
}

// process applies msg in its tenant's database.
func (t *tenants) process(ctx context.Context, c *Consumer, msg *Message) Result {
	db, res, ok := t.resolve(ctx, c, msg)
	if !ok {
		return res
	}
	tn, err := t.tenant(db)
	if err != nil {
		return c.finish(ctx, time.Now(), retryLater(msgID(msg), err))
	}
	defer t.release(tn)
	return tn.consumer.Process(ctx, msg)
}

// processBatch splits msgs by database, applies each part with
// ProcessBatch, one database at a time, and puts every result in its
// message's place.
func (t *tenants) processBatch(ctx context.Context, c *Consumer, msgs []*Message) []Result {
	results := make([]Result, len(msgs))
	type part struct {
		db   fleet.Database
		idx  []int
		msgs []*Message
	}
	var parts []*part
	byDB := map[string]*part{}
	for i, msg := range msgs {
		db, res, ok := t.resolve(ctx, c, msg)
		if !ok {
			results[i] = res
			continue
		}
		p := byDB[db.Name]
		if p == nil {
			p = &part{db: db}
			byDB[db.Name] = p
			parts = append(parts, p)
		}
		p.idx, p.msgs = append(p.idx, i), append(p.msgs, msg)
	}
	for _, p := range parts {
		tn, err := t.tenant(p.db)
		for j, msg := range p.msgs {
			if err != nil {
				results[p.idx[j]] = c.finish(ctx, time.Now(), retryLater(msgID(msg), err))
			}
		}
		if err != nil {
			continue
		}
		for j, r := range tn.consumer.ProcessBatch(ctx, p.msgs) {
			results[p.idx[j]] = r
		}
		t.release(tn)
	}
	return results
}

// resolve returns the database of msg's tenant, or the result of a
// message that has none.
func (t *tenants) resolve(ctx context.Context, c *Consumer, msg *Message) (fleet.Database, Result, bool) {
	var name string
	err := guard("Route", func() (err error) {
		if msg == nil {
			return fmt.Errorf("%w: nil message", ErrInvalidMessage)
		}
		name, err = t.route(msg)
		return err
	})
	if err != nil {
		return fleet.Database{}, c.finish(ctx, time.Now(), Result{Outcome: DeadLettered, Key: msgID(msg), Err: fmt.Errorf("%w: route: %w", ErrInvalidMessage, err)}), false
	}
	db, err := t.lookup(ctx, name)
	if err != nil {
		return fleet.Database{}, c.finish(ctx, time.Now(), retryLater(msgID(msg), err)), false
	}
	if db.Name == "" {
		return fleet.Database{}, c.finish(ctx, time.Now(), Result{Outcome: DeadLettered, Key: msgID(msg), Err: fmt.Errorf("%w: %q", ErrUnknownTenant, name)}), false
	}
	return db, Result{}, true
}

func msgID(msg *Message) string {
	if msg == nil {
		return ""
	}
	return msg.ID
}

// lookup returns the database named name, reading the Source again (at
// most every Reload) when it does not list it; a zero Database when it is
// not in the fleet.
func (t *tenants) lookup(ctx context.Context, name string) (fleet.Database, error) {
	t.mu.Lock()
	db, ok := t.known[name]
	stale := time.Since(t.read) >= t.cfg.Reload
	t.mu.Unlock()
	if ok || !stale && t.known != nil {
		return db, nil
	}
	t.readMu.Lock()
	defer t.readMu.Unlock()
	t.mu.Lock()
	db, ok = t.known[name]
	fresh := time.Since(t.read) < t.cfg.Reload && t.known != nil
	t.mu.Unlock()
	if ok || fresh {
		return db, nil
	}
	dbs, err := t.src.Databases(ctx)
	if err != nil {
		return fleet.Database{}, err
	}
	known := make(map[string]fleet.Database, len(dbs))
	for _, d := range dbs {
		known[d.Name] = d
	}
	t.mu.Lock()
	t.known, t.read = known, time.Now()
	for n, tn := range t.open { // removed tenants, or moved ones, are closed once idle
		if d, ok := known[n]; (!ok || d.ConnString != tn.db.ConnString) && tn.busy == 0 {
			t.closeLocked(tn)
		}
	}
	t.mu.Unlock()
	return known[name], nil
}

// tenant returns db's tenant with a hold on it, opening its pool within
// the server's budget.
func (t *tenants) tenant(db fleet.Database) (*tenant, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tn, ok := t.open[db.Name]; ok && tn.db.ConnString == db.ConnString {
		tn.busy++
		tn.used = time.Now()
		return tn, nil
	}
	server, err := db.Server()
	if err != nil {
		return nil, err
	}
	for !t.budget.TryReserve(server, t.cfg.ConnsPerDatabase) {
		if !t.evictLocked(server) {
			return nil, fmt.Errorf("consumer: the connection budget of %s (%d) is in use by other tenants' messages", server, t.cfg.ConnsPerServer)
		}
	}
	pcfg, err := pgxpool.ParseConfig(db.ConnString)
	if err != nil {
		t.budget.Release(server, t.cfg.ConnsPerDatabase)
		return nil, err
	}
	pcfg.MaxConns, pcfg.MinConns, pcfg.MinIdleConns = int32(t.cfg.ConnsPerDatabase), 0, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg) // connects on first use
	if err != nil {
		t.budget.Release(server, t.cfg.ConnsPerDatabase)
		return nil, err
	}
	cfg := t.cfg.Config
	cfg.Logger = cfg.Logger.With("database", db.Name)
	c, err := New(pool, t.scope, t.handler, cfg)
	if err != nil {
		pool.Close()
		t.budget.Release(server, t.cfg.ConnsPerDatabase)
		return nil, err
	}
	tn := &tenant{db: db, server: server, pool: pool, consumer: c, used: time.Now(), busy: 1}
	t.open[db.Name] = tn
	return tn, nil
}

// release ends a hold on tn.
func (t *tenants) release(tn *tenant) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tn.busy--
}

// evictLocked closes the least recently used idle tenant of server and
// reports whether there was one.
func (t *tenants) evictLocked(server string) bool {
	var lru *tenant
	for _, tn := range t.open {
		if tn.server == server && tn.busy == 0 && (lru == nil || tn.used.Before(lru.used)) {
			lru = tn
		}
	}
	if lru != nil {
		t.closeLocked(lru)
	}
	return lru != nil
}

func (t *tenants) closeLocked(tn *tenant) {
	delete(t.open, tn.db.Name)
	tn.pool.Close()
	t.budget.Release(tn.server, t.cfg.ConnsPerDatabase)
}

// migrate migrates the inbox of every database of the Source, four at a
// time, and reports every failure.
func (t *tenants) migrate(ctx context.Context, c *Consumer) error {
	dbs, err := t.src.Databases(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range fleet.Each(ctx, dbs, 4, func(ctx context.Context, _ fleet.Database, conn *pgx.Conn) error {
		store, err := inbox.New(conn, c.cfg.Inbox)
		if err != nil {
			return err
		}
		return store.Migrate(ctx)
	}) {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Database.Name, r.Err))
		}
	}
	return errors.Join(errs...)
}

// Tenant returns the Consumer of one database of a routed consumer (its
// inbox, for administration), opening its pool; nil with an error when
// c is not routed or the Source does not list database.
func (c *Consumer) Tenant(ctx context.Context, database string) (*Consumer, error) {
	if c.tenants == nil {
		return nil, idemq.NewConfigError(component, "Tenant", "the consumer is not routed (see NewRouted)")
	}
	db, err := c.tenants.lookup(ctx, database)
	if err != nil {
		return nil, err
	}
	if db.Name == "" {
		return nil, fmt.Errorf("%w: %q", ErrUnknownTenant, database)
	}
	tn, err := c.tenants.tenant(db)
	if err != nil {
		return nil, err
	}
	c.tenants.release(tn)
	return tn.consumer, nil
}

// noDatabase is the handle of a routed consumer's template, which only
// checks keys: every statement fails.
type noDatabase struct{}

var errNoDatabase = errors.New("consumer: a routed consumer's statements go to its tenants' databases")

func (noDatabase) Begin(context.Context) (pgx.Tx, error) { return nil, errNoDatabase }
func (noDatabase) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNoDatabase
}
func (noDatabase) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errNoDatabase }
func (noDatabase) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return errNoDatabase }
