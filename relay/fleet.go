package relay

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/internal/outboxsql"
	"github.com/idemq/idemq/outbox"
)

// FleetConfig configures a [Fleet].
type FleetConfig struct {
	// Relay configures the relay of each database. Its Workers is per
	// database; ListenConnString is ignored (each database's own
	// connection string is used).
	Relay Config
	// Outbox names the outbox table, the same in every database.
	Outbox outbox.Config
	// ConnsPerServer is the most connections this process holds on one
	// Postgres server, all its databases together. A database being
	// drained holds Relay.Workers+3 (the workers, the backlog reads, the
	// heartbeat, LISTEN); one more per server watches the statistics.
	// Defaults to 20.
	ConnsPerServer int
	// Quantum is how long a database with work keeps its connections
	// while other databases of its server wait for them: a tenant with a
	// backlog of millions drains in turns, between the others. Defaults
	// to 2 seconds.
	Quantum time.Duration
	// IdleRelease is how long a database with nothing to publish keeps
	// its relay (and its LISTEN) when no other database waits: active
	// databases are woken by NOTIFY, idle ones by the statistics.
	// Defaults to 30 seconds.
	IdleRelease time.Duration
	// WatchInterval is how often the statistics of each server are read
	// to find the databases that saw writes. Defaults to 500ms.
	WatchInterval time.Duration
	// Sweep is how often every database is looked at even without a sign
	// of writes (statistics reset or lost in a crash). Defaults to 1
	// minute.
	Sweep time.Duration
	// Reload is how often the Source is read again. Defaults to 30
	// seconds.
	Reload time.Duration
	// Logger receives one line per change of state of a database
	// (unreachable, back, dropped, added, removed), never one per visit.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Fleet defaults.
const (
	ConnsPerServerDefault = 20
	QuantumDefault        = 2 * time.Second
	IdleReleaseDefault    = 30 * time.Second
	WatchIntervalDefault  = 500 * time.Millisecond
	SweepDefault          = time.Minute
	ReloadDefault         = 30 * time.Second
)

// fleetBackoff spaces the visits of a database that failed: unreachable,
// dropped, read-only or not migrated.
var fleetBackoff = idemq.Retry{BaseDelay: time.Second, MaxDelay: time.Minute}

func (c FleetConfig) withDefaults() FleetConfig {
	c.Relay = c.Relay.withDefaults()
	c.Relay.ListenConnString = ""
	c.ConnsPerServer = cmp.Or(c.ConnsPerServer, ConnsPerServerDefault)
	c.Quantum = cmp.Or(c.Quantum, QuantumDefault)
	c.IdleRelease = cmp.Or(c.IdleRelease, IdleReleaseDefault)
	c.WatchInterval = cmp.Or(c.WatchInterval, WatchIntervalDefault)
	c.Sweep = cmp.Or(c.Sweep, SweepDefault)
	c.Reload = cmp.Or(c.Reload, ReloadDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// connsPerDatabase is what one database being drained holds.
func (c FleetConfig) connsPerDatabase() int { return c.Relay.Workers + 3 }

func (c FleetConfig) validate() error {
	if err := c.Relay.validate(); err != nil {
		return err
	}
	if c.ConnsPerServer < c.connsPerDatabase()+1 {
		return idemq.NewConfigError("relay.Fleet", "ConnsPerServer", "%d is below %d: one database's relay needs Workers+3 connections and the watcher one", c.ConnsPerServer, c.connsPerDatabase()+1)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Quantum", c.Quantum}, {"IdleRelease", c.IdleRelease}, {"WatchInterval", c.WatchInterval}, {"Sweep", c.Sweep}, {"Reload", c.Reload}} {
		if d.v < 10*time.Millisecond {
			return idemq.NewConfigError("relay.Fleet", d.name, "%v is below 10ms", d.v)
		}
	}
	return nil
}

// Fleet drains the outboxes of many databases from one process, within a
// connection budget per server. Run several processes with the same
// Source and they share the work: within a database partitions are leased
// and fenced exactly as by a single [Relay]; a process turns to a
// database that no other process is draining before one that another
// process already drains.
//
// A database is drained by a Relay opened for it while it has work. Which
// databases have work is read from each server's statistics (see
// fleet.Watcher) every WatchInterval, from NOTIFY while a database's relay
// runs, and by a visit to every database every Sweep. So a row enqueued
// in an idle database is published within WatchInterval plus the
// statistics' delay (about a second while the writer's session stays
// busy, up to 10 seconds after its last transaction), and within Sweep in
// any case; in a database whose relay runs, as fast as by a lone Relay.
// Databases waiting for connections take turns of Quantum each, first
// come first served, so one tenant's backlog does not hold back another's.
// A database that cannot be drained (unreachable, dropped, read-only, not
// migrated) is tried again with a jittered backoff of up to a minute,
// logged once when it fails and once when it is back, and never holds
// connections the others need.
//
// The Sink is shared by every database's relay: it must take concurrent
// calls, as with Workers > 1. A Sink that is a [Watermarker] (the
// transactional Kafka sink) is refused: its transactional ids are per
// partition, which would collide across databases.
type Fleet struct {
	src    fleet.Source
	sink   Sink
	cfg    FleetConfig
	log    *slog.Logger
	budget *fleet.Budget
	sql    outboxsql.Queries
	state  lifecycle.State

	mu     sync.Mutex
	dbs    map[string]*fleetDB
	loaded bool          // the Source was read once
	wake   chan struct{} // a visit ended, or a relay caught up
}

// FleetDatabase is the state of one database of a [Fleet].
type FleetDatabase struct {
	Name, Server string
	// Draining is true while this process runs the database's relay.
	Draining bool
	// Published counts the rows this process published from it.
	Published int64
	// Err is the last failure, while the database cannot be drained.
	Err error
	// Since is when the failure began, or the draining.
	Since time.Time
}

// fleetDB is the scheduler's record of one database. Only the scheduler
// goroutine reads and writes it, under Fleet.mu for Databases.
type fleetDB struct {
	fleet.Database
	server    string
	queued    bool
	next      time.Time // when an idle database is looked at again
	lastVisit time.Time
	failures  int
	err       error
	since     time.Time
	run       *fleetRun
	published int64
	removed   bool
}

// fleetRun is one visit of a database: its pool, then its relay.
type fleetRun struct {
	cancel    context.CancelFunc
	done      chan visit
	started   time.Time
	active    atomic.Int64 // unix nanoseconds of the last sign of work
	published atomic.Int64 // rows published in this visit
	draining  atomic.Bool  // the relay started
	caughtUp  atomic.Bool  // its last batch was not full: nothing more was due
}

// visit is what a visit found.
type visit struct {
	published int64
	next      time.Time // a row that is not due yet, zero if none
	busy      bool      // another process drains it and others wait
	err       error
}

// NewFleet validates cfg and returns a fleet draining the outboxes of the
// databases src lists into sink.
func NewFleet(src fleet.Source, sink Sink, cfg FleetConfig) (*Fleet, error) {
	switch {
	case nilcheck.IsNil(src):
		return nil, idemq.NewConfigError("relay.Fleet", "source", "is nil")
	case nilcheck.IsNil(sink):
		return nil, idemq.NewConfigError("relay.Fleet", "sink", "is nil")
	}
	if err := noWatermarker(sink); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ob := cfg.Outbox
	sql, err := outboxsql.For(cmp.Or(ob.Schema, outbox.SchemaDefault), cmp.Or(ob.Table, outbox.TableDefault))
	if err != nil {
		return nil, idemq.NewConfigError("relay.Fleet", "Outbox", "%v", err)
	}
	budget, err := fleet.NewBudget(cfg.ConnsPerServer)
	if err != nil {
		return nil, err
	}
	return &Fleet{src: src, sink: sink, cfg: cfg, budget: budget, sql: sql,
		log: cfg.Logger.With("component", "idemq.relay.fleet"), dbs: map[string]*fleetDB{}, wake: make(chan struct{}, 1)}, nil
}

// Ready is closed once Run read the Source the first time.
func (f *Fleet) Ready() <-chan struct{} { return f.state.Ready() }

// Budget returns the fleet's connection budget, to read what it holds on
// each server.
func (f *Fleet) Budget() *fleet.Budget { return f.budget }

// Databases returns the state of every database, by name.
func (f *Fleet) Databases() []FleetDatabase {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]FleetDatabase, 0, len(f.dbs))
	for _, d := range f.dbs {
		fd := FleetDatabase{Name: d.Name, Server: d.server, Published: d.published, Err: d.err, Since: d.since}
		if d.run != nil && d.run.draining.Load() {
			fd.Draining = true
			fd.Since = d.run.started
		}
		out = append(out, fd)
	}
	return out
}

// Run drains the fleet until ctx is done, then stops every relay (each
// within Relay.ShutdownGrace) and returns nil. It returns an error only
// when the Source fails at the first read.
func (f *Fleet) Run(ctx context.Context) error {
	ready, end, err := f.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	if err := noWatermarker(f.sink); err != nil { // a Router's routes are added after NewFleet
		return err
	}
	if err := f.reload(ctx); err != nil {
		return err
	}
	ready()
	f.log.Info("relay fleet started", "databases", len(f.dbs), "conns_per_server", f.cfg.ConnsPerServer)
	watchers := map[string]*fleet.Watcher{}
	defer func() {
		for server, w := range watchers {
			w.Close()
			f.budget.Release(server, 1)
		}
	}()
	tick := time.NewTicker(min(f.cfg.WatchInterval, 100*time.Millisecond))
	defer tick.Stop()
	var lastReload, lastWatch time.Time
	for {
		now := time.Now()
		if now.Sub(lastReload) >= f.cfg.Reload {
			lastReload = now
			if err := f.reload(ctx); err != nil && ctx.Err() == nil {
				f.log.Warn("relay fleet: reading the databases failed; keeping the last list", "err", err)
			}
		}
		if now.Sub(lastWatch) >= f.cfg.WatchInterval {
			lastWatch = now
			f.watch(ctx, watchers)
		}
		f.schedule(ctx, now)
		select {
		case <-ctx.Done():
			f.stopAll()
			f.log.Info("relay fleet stopped")
			return nil
		case <-tick.C:
		case <-f.wake:
		}
	}
}

// signal wakes the scheduler.
func (f *Fleet) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// reload reads the Source and adds and removes databases.
func (f *Fleet) reload(ctx context.Context) error {
	dbs, err := f.src.Databases(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := make(map[string]bool, len(dbs))
	for _, d := range dbs {
		seen[d.Name] = true
		if old, ok := f.dbs[d.Name]; ok && old.ConnString == d.ConnString {
			continue
		} else if ok {
			old.removed = true // moved: the old one stops, the new one starts
		}
		server, _ := d.Server() // fleet.Check parsed it
		f.dbs[d.Name] = &fleetDB{Database: d, server: server, queued: true}
		if f.loaded {
			f.log.Info("relay fleet: database added", "database", d.Name, "server", server)
		}
	}
	f.loaded = true
	for name, d := range f.dbs {
		if !seen[name] && !d.removed {
			d.removed = true
			f.log.Info("relay fleet: database removed; releasing it", "database", name)
		}
	}
	return nil
}

// watch marks the databases whose statistics moved.
func (f *Fleet) watch(ctx context.Context, watchers map[string]*fleet.Watcher) {
	byServer := map[string][]fleet.Database{}
	f.mu.Lock()
	for _, d := range f.dbs {
		if !d.removed {
			byServer[d.server] = append(byServer[d.server], d.Database)
		}
	}
	f.mu.Unlock()
	for server, dbs := range byServer {
		w, ok := watchers[server]
		if !ok {
			if !f.budget.TryReserve(server, 1) {
				continue // the sweep covers this server until a connection frees
			}
			w = fleet.NewWatcher(server)
			watchers[server] = w
		}
		wctx, cancel := context.WithTimeout(ctx, f.cfg.WatchInterval+time.Second)
		changed, err := w.Changed(wctx, dbs)
		cancel()
		if err != nil {
			continue // each database's own visit reports its failure
		}
		f.mu.Lock()
		for _, d := range changed {
			if fd := f.dbs[d.Name]; fd != nil && fd.err == nil {
				fd.queued = true
			}
		}
		f.mu.Unlock()
	}
}

// schedule ends visits, stops relays that should give their connections
// up, and starts visits of queued databases while the budget allows.
func (f *Fleet) schedule(ctx context.Context, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	waiting := map[string][]*fleetDB{}
	for _, d := range f.dbs {
		if d.run != nil {
			select {
			case v := <-d.run.done:
				f.finish(d, v, now)
			default:
			}
		}
		if d.run == nil && d.removed {
			delete(f.dbs, d.Name)
			continue
		}
		if d.run == nil && !d.queued && (!d.next.IsZero() && !now.Before(d.next) || now.Sub(d.lastVisit) >= f.cfg.Sweep) {
			d.queued = true
		}
		if d.run == nil && d.queued {
			waiting[d.server] = append(waiting[d.server], d)
		}
	}
	for _, d := range f.dbs {
		if r := d.run; r != nil && d.removed {
			r.cancel()
		} else if r != nil && r.draining.Load() {
			idle := now.Sub(time.Unix(0, r.active.Load()))
			crowded := len(waiting[d.server]) > 0
			// A crowded server takes back the connections of a relay that
			// had its turn, that published and then found nothing more for
			// a moment, or that published nothing in its first second.
			turn, published := now.Sub(r.started), r.published.Load() > 0
			caughtUp := r.caughtUp.Load() || idle >= 100*time.Millisecond
			if crowded && (turn >= f.cfg.Quantum || published && caughtUp || !published && turn >= time.Second) ||
				idle >= f.cfg.IdleRelease {
				r.cancel()
			}
		}
	}
	for server, queue := range waiting {
		// First come, first served: the database waiting longest goes first.
		slices.SortFunc(queue, func(a, b *fleetDB) int { return a.lastVisit.Compare(b.lastVisit) })
		for i, d := range queue {
			if !f.budget.TryReserve(server, f.cfg.connsPerDatabase()) {
				break
			}
			d.queued = false
			d.run = f.start(ctx, d.Database, d.server, len(queue)-i-1 > 0)
		}
	}
}

// finish records the end of a visit and gives its connections back.
func (f *Fleet) finish(d *fleetDB, v visit, now time.Time) {
	f.budget.Release(d.server, f.cfg.connsPerDatabase())
	d.run, d.lastVisit, d.next = nil, now, v.next
	d.published += v.published
	switch {
	case v.busy:
		d.next = now.Add(f.cfg.Quantum) // another process drains it; look again later
	case v.err != nil:
		if d.err == nil {
			d.since = now
			f.log.Warn("relay fleet: database cannot be drained; retrying with backoff", "database", d.Name, "server", d.server, "err", v.err)
		}
		d.err = v.err
		d.failures++
		d.next = now.Add(fleetBackoff.Delay(d.failures, 0))
	case d.err != nil:
		f.log.Info("relay fleet: database is back", "database", d.Name, "server", d.server, "down_for", now.Sub(d.since).Round(time.Second).String())
		d.err, d.failures, d.since = nil, 0, time.Time{}
	}
}

// start begins a visit of db in a goroutine of its own.
func (f *Fleet) start(ctx context.Context, db fleet.Database, server string, others bool) *fleetRun {
	vctx, cancel := context.WithCancel(ctx)
	r := &fleetRun{cancel: cancel, done: make(chan visit, 1), started: time.Now()}
	r.active.Store(r.started.UnixNano())
	go func() {
		defer cancel()
		r.done <- f.visit(vctx, db, r, others)
		f.signal()
	}()
	return r
}

// visit opens db's pool, looks for due rows and, when there are, runs its
// relay until the scheduler cancels ctx; then looks for the next due row.
func (f *Fleet) visit(ctx context.Context, db fleet.Database, run *fleetRun, othersWait bool) visit {
	pcfg, err := pgxpool.ParseConfig(db.ConnString)
	if err != nil {
		return visit{err: err}
	}
	pcfg.MaxConns, pcfg.MinConns, pcfg.MinIdleConns = int32(f.cfg.Relay.Workers+1), 0, 0
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return visit{err: err}
	}
	defer pool.Close()
	next, err := f.probe(ctx, pool)
	if err != nil || next.IsZero() || next.After(time.Now()) {
		return visit{next: next, err: dropped(err)}
	}
	if othersWait {
		var live int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+f.sql.Relays+` WHERE expires_at > now()`).Scan(&live); err != nil {
			return visit{err: err}
		}
		if live > 0 {
			return visit{busy: true}
		}
	}
	ob, err := outbox.New(pool, f.cfg.Outbox)
	if err != nil {
		return visit{err: err}
	}
	cfg := f.cfg.Relay
	cfg.Logger = f.cfg.Relay.Logger.With("database", db.Name)
	cfg.Hooks = fleetHooks(cfg.Hooks, func(published int, batch bool) {
		run.active.Store(time.Now().UnixNano())
		run.published.Add(int64(published))
		if batch && published < cfg.BatchSize {
			run.caughtUp.Store(true)
			f.signal()
		} else if batch {
			run.caughtUp.Store(false)
		}
	})
	rl, err := New(pool, ob, f.sink, cfg)
	if err != nil {
		return visit{err: err}
	}
	run.draining.Store(true)
	run.active.Store(time.Now().UnixNano())
	runErr := rl.Run(ctx)
	v := visit{published: run.published.Load(), err: runErr}
	if runErr == nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		v.next, v.err = f.probe(pctx, pool)
	}
	return v
}

// probe returns when the first row of the outbox that is due, or will be,
// becomes due, looking at both ends of the outbox (the oldest rows, and
// the newest, where new rows land); zero when the outbox is empty.
func (f *Fleet) probe(ctx context.Context, pool *pgxpool.Pool) (time.Time, error) {
	var next *time.Time
	err := pool.QueryRow(ctx, `SELECT min(available_at) FROM ((SELECT available_at FROM `+f.sql.Table+` ORDER BY seq LIMIT 1000)
		UNION ALL (SELECT available_at FROM `+f.sql.Table+` ORDER BY seq DESC LIMIT 1000)) s`).Scan(&next)
	if err != nil || next == nil {
		return time.Time{}, err
	}
	return *next, nil
}

// dropped names a database that does not exist (any more).
func dropped(err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "3D000" {
		return errors.Join(errors.New("database dropped"), err)
	}
	return err
}

// stopAll cancels every visit and waits for each to end.
func (f *Fleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.dbs {
		if d.run != nil {
			d.run.cancel()
			f.finish(d, <-d.run.done, time.Now())
		}
	}
}

// noWatermarker refuses a Sink that is, or routes to, a Watermarker (the
// transactional Kafka sink): its transactional ids are per outbox
// partition and would collide across databases.
func noWatermarker(sink Sink) error {
	sinks := []Sink{sink}
	if r, ok := sink.(*Router); ok {
		sinks = sinks[:0]
		for _, s := range r.exact {
			sinks = append(sinks, s)
		}
		for _, p := range r.prefixes {
			sinks = append(sinks, p.sink)
		}
	}
	for _, s := range sinks {
		if _, ok := s.(Watermarker); ok {
			return idemq.NewConfigError("relay.Fleet", "sink", "is or routes to a Watermarker (a transactional Kafka sink): its transactional ids are per outbox partition and would collide across databases")
		}
	}
	return nil
}

// fleetHooks returns user's hooks with work reported to active: a
// published batch (batch true), a retried or dead-lettered message.
func fleetHooks(user Hooks, active func(published int, batch bool)) Hooks {
	h := user
	h.OnPublished = func(e PublishedEvent) {
		active(len(e.Messages), true)
		if user.OnPublished != nil {
			user.OnPublished(e)
		}
	}
	h.OnRetried = func(e RetriedEvent) {
		active(0, false)
		if user.OnRetried != nil {
			user.OnRetried(e)
		}
	}
	h.OnDeadLettered = func(e DeadLetteredEvent) {
		active(0, false)
		if user.OnDeadLettered != nil {
			user.OnDeadLettered(e)
		}
	}
	return h
}
