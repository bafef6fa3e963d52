package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/internal/outboxsql"
	"github.com/idemq/idemq/outbox"
)

// Defaults of [Config].
const (
	BatchSizeDefault      = 500
	WorkersDefault        = 1
	PollIntervalDefault   = time.Second
	RescanIntervalDefault = time.Minute
	LeaseTTLDefault       = 10 * time.Second
	PublishTimeoutDefault = 30 * time.Second
	ShutdownGraceDefault  = 10 * time.Second
	StatsIntervalDefault  = 15 * time.Second
	StallThresholdDefault = time.Minute
)

// RetryDefault is the relay's retry policy where [Config.Retry] leaves a
// field zero: 10 attempts, delays from 1 second up to 5 minutes.
var RetryDefault = idemq.Retry{MaxAttempts: 10, BaseDelay: time.Second, MaxDelay: 5 * time.Minute}

// Config configures a [Relay]. Zero values mean the documented defaults.
type Config struct {
	// BatchSize is the most rows one claim takes. At most
	// [BatchSizeMax]. Defaults to 500.
	BatchSize int
	// Workers is the number of batches this relay has in flight at once,
	// each on its own connection. Each worker leases its share of the key
	// partitions like a relay of its own (see the package documentation).
	// At most [WorkersMax]. Defaults to 1.
	Workers int
	// PollInterval is how often an idle relay looks for due rows without
	// being woken by NOTIFY. At least [PollIntervalMin]. Defaults to 1
	// second.
	PollInterval time.Duration
	// RescanInterval is how often a worker scans the outbox from its start
	// again anyway. Rows that committed late, came back from the dead
	// letters or were released by another relay are found without it (see
	// the package documentation); it is a safety net, and each rescan
	// reads through the dead rows that vacuum has not removed yet.
	// Defaults to 1 minute.
	RescanInterval time.Duration
	// LeaseTTL is how long a worker's leases on its key partitions outlive
	// its last heartbeat (sent every LeaseTTL/3): when a relay dies
	// without stopping, the messages of its partitions wait that long
	// before other relays take them over. Workers rebalance the
	// partitions among themselves every LeaseTTL/10. A relay that stops
	// gives its partitions up at once; one that stalls in the middle of a
	// batch holds them until the server ends the batch's transaction,
	// PublishTimeout + LeaseTTL/3 after its claim (33.3 seconds on the
	// defaults), or LeaseTTL after its last heartbeat if that is later.
	// Between [LeaseTTLMin] and [LeaseTTLMax]. Defaults to 10 seconds.
	LeaseTTL time.Duration
	// Retry shapes the backoff between failed publishes of a row and the
	// attempts after which it becomes a dead letter (errors marked with
	// idemq.Permanent dead-letter at once; idemq.RetryAfter delays a retry).
	// MaxElapsed is ignored: the row keeps its attempts. Defaults to
	// [RetryDefault].
	Retry idemq.Retry
	// ParkFollowers keeps the later messages of a key waiting while an
	// earlier message of that key is a dead letter, until it is replayed or
	// purged. By default they proceed.
	ParkFollowers bool
	// GlobalKeyOrder keeps a key's messages in enqueue order across all
	// their destinations: a message failing on one destination then holds
	// back the key's later messages to every destination (and a dead letter
	// parks them all, with ParkFollowers). By default the order of a key is
	// kept per destination, and a destination that fails holds back only
	// its own messages.
	GlobalKeyOrder bool
	// PublishTimeout bounds one Sink call; the claimed rows stay locked in
	// an open transaction meanwhile. It is above the transports' own
	// bounds of one request (a webhook's 15 seconds, a JetStream ack's
	// 10), so that a slow destination fails its messages rather than the
	// whole batch. It also bounds how long a relay stalled mid-batch holds
	// its partitions (see LeaseTTL). Between [PublishTimeoutMin] and
	// [PublishTimeoutMax]. Defaults to 30 seconds.
	PublishTimeout time.Duration
	// ShutdownGrace is how long in-flight batches may finish after Run's
	// context is done; rows of batches still publishing then are released
	// for the next relay. Defaults to 10 seconds.
	ShutdownGrace time.Duration
	// ListenConnString is the connection LISTEN uses, a direct one where
	// the pool sits behind a transaction-pooling proxy. Defaults to the
	// pool's configuration.
	ListenConnString string
	// DisableListen makes the relay poll only.
	DisableListen bool
	// StatsInterval is how often the relay reads the backlog
	// (outbox.Outbox.Stats, which scans the outbox): for
	// [Hooks.OnBacklog], the backlog line of the log and stall detection.
	// A read that takes longer than a tenth of it spaces the reads out
	// to ten times its duration. At least [StatsIntervalMin]. Defaults to
	// 15 seconds.
	StatsInterval time.Duration
	// StallThreshold is how long a message free to go (due, and no
	// earlier message of its key waiting for a retry) may have been due
	// before the relay logs a stall: partitions nobody owns, rows locked
	// by someone else, a relay that cannot keep up. Defaults to 1 minute.
	StallThreshold time.Duration
	// VacuumEvery makes the relay VACUUM the outbox table after it has
	// claimed this many rows, for servers where autovacuum is off or too
	// slow (see the package documentation). It needs the table owner's
	// rights; failures are logged. Any count is safe (it is compared,
	// never allocated). Defaults to 0: off, autovacuum's job.
	VacuumEvery int
	// Hooks receive metrics. All optional.
	Hooks Hooks
	// Logger receives one line per change of state, never one per
	// message: start and stop, failing destinations (a broker or webhook
	// endpoint away) and their end, held destinations, database outages, partitions
	// acquired, released, taken over and lost, the backlog every
	// StatsInterval while messages are pending, stalls, dead letters per
	// batch. Defaults to slog.Default(), so that an application's
	// slog.SetDefault applies; pass a logger with a discarding handler to
	// silence it.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.Workers = cmp.Or(c.Workers, WorkersDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.RescanInterval = cmp.Or(c.RescanInterval, RescanIntervalDefault)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, LeaseTTLDefault)
	c.Retry = c.Retry.WithDefaults(RetryDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, PublishTimeoutDefault)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, ShutdownGraceDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	c.StallThreshold = cmp.Or(c.StallThreshold, StallThresholdDefault)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// LeaseTTLMin is the shortest [Config.LeaseTTL] accepted. Workers beat
// every LeaseTTL/3 and rebalance every LeaseTTL/10; a shorter lease would
// make the heartbeat the relay's main load, lose partitions to any pause,
// and below a microsecond be stored as no lease at all.
const LeaseTTLMin = 100 * time.Millisecond

// PollIntervalMin is the shortest [Config.PollInterval] accepted. Each
// poll is a query per worker; below a millisecond, about one round trip to
// a local server, an idle relay would poll in a busy loop, spending a CPU
// and the database on finding nothing.
const PollIntervalMin = time.Millisecond

// StatsIntervalMin is the shortest [Config.StatsInterval] accepted. Each
// backlog read scans the outbox; below 10ms an idle relay would read it
// back to back, which is a busy loop on the database and not a fresher
// gauge any dashboard can show.
const StatsIntervalMin = 10 * time.Millisecond

// PublishTimeoutMin is the shortest [Config.PublishTimeout] accepted: a
// publish to any broker takes at least a round trip, and below 10ms
// every batch would time out and its rows go back, retried without end.
const PublishTimeoutMin = 10 * time.Millisecond

// PublishTimeoutMax is the longest [Config.PublishTimeout] accepted. The
// batch's rows stay locked that long, and the server's
// idle_in_transaction_session_timeout, which fences a stalled batch, is
// PublishTimeout + LeaseTTL/3 in milliseconds of a 32-bit integer.
const PublishTimeoutMax = time.Hour

// LeaseTTLMax is the longest [Config.LeaseTTL] accepted: a relay that dies
// holds its partitions that long, and the server's fence of a stalled
// batch (PublishTimeout + LeaseTTL/3) must stay within Postgres' 32-bit
// millisecond timeout.
const LeaseTTLMax = time.Hour

// BatchSizeMax is the largest [Config.BatchSize] accepted. A batch is one
// transaction holding its rows locked, a window the worker allocates
// whole, and one Sink call; past 10,000 rows these grow (to out of
// memory at 1<<31) with no gain in throughput, which levels off in the
// hundreds.
const BatchSizeMax = 10_000

// WorkersMax is the largest [Config.Workers] accepted: one per outbox key
// partition (64). A worker beyond that would own no
// partition, and each holds a connection of the pool.
const WorkersMax = outboxsql.Partitions

func (c Config) validate() error {
	for _, f := range []struct {
		name           string
		d, least, most time.Duration // most 0: no maximum
	}{
		{"LeaseTTL", c.LeaseTTL, LeaseTTLMin, LeaseTTLMax},
		{"PollInterval", c.PollInterval, PollIntervalMin, 0},
		{"StatsInterval", c.StatsInterval, StatsIntervalMin, 0},
		{"PublishTimeout", c.PublishTimeout, PublishTimeoutMin, PublishTimeoutMax},
	} {
		if f.d < f.least {
			return idemq.NewConfigError("relay", f.name, "%v is below the minimum of %v; leave it 0 for the default", f.d, f.least)
		}
		if f.most > 0 && f.d > f.most {
			return idemq.NewConfigError("relay", f.name, "%v is above the maximum of %v", f.d, f.most)
		}
	}
	for _, f := range []struct {
		name    string
		n, most int
	}{
		{"BatchSize", c.BatchSize, BatchSizeMax},
		{"Workers", c.Workers, WorkersMax},
	} {
		if f.n > f.most {
			return idemq.NewConfigError("relay", f.name, "%d is above the maximum of %d", f.n, f.most)
		}
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"BatchSize", int64(c.BatchSize)},
		{"Workers", int64(c.Workers)},
		{"RescanInterval", int64(c.RescanInterval)},
		{"ShutdownGrace", int64(c.ShutdownGrace)},
		{"StallThreshold", int64(c.StallThreshold)},
	} {
		if f.v < 0 {
			return idemq.NewConfigError("relay", f.name, "is negative")
		}
	}
	return c.Retry.Validate("relay")
}

// Hooks are optional metric callbacks. They run on the relay's goroutines
// and must be quick and safe for concurrent use.
type Hooks struct {
	// OnPublished is called after a batch committed.
	OnPublished func(PublishedEvent)
	// OnFailed is called for every message whose publish failed, before it
	// is retried or dead-lettered. Messages held or skipped (not
	// attempted) go to OnHeld and OnSkipped instead.
	OnFailed func(FailedEvent)
	// OnHeld is called for every message the Sink held without an
	// attempt (ErrSkipped with an idemq.RetryAfter hint: no route, a
	// disabled webhook endpoint, an open breaker), after its batch
	// committed.
	OnHeld func(HeldEvent)
	// OnSkipped is called for every message not attempted because an
	// earlier message of its key failed, after its batch committed.
	OnSkipped func(SkippedEvent)
	// OnRetried is called for a failed message rescheduled.
	OnRetried func(RetriedEvent)
	// OnDeadLettered is called for a message moved to the dead letters.
	OnDeadLettered func(DeadLetteredEvent)
	// OnBacklog is called every Config.StatsInterval.
	OnBacklog func(BacklogEvent)
}

// PublishedEvent reports the delivered messages of a committed batch.
type PublishedEvent struct {
	// Messages were delivered; Message.CreatedAt gives each one's age.
	Messages []Message
	// Took is the duration of the Sink call.
	Took time.Duration
}

// FailedEvent reports a failed publish of one message.
type FailedEvent struct {
	Message Message
	Err     error
}

// HeldEvent reports a message held without an attempt.
type HeldEvent struct {
	Message Message
	Err     error
	// Delay is the wait before the message comes back.
	Delay time.Duration
}

// SkippedEvent reports a message put back behind an earlier failed
// message of its key, without an attempt.
type SkippedEvent struct {
	Message Message
	Err     error
}

// RetriedEvent reports a failed message put back for a later attempt.
type RetriedEvent struct {
	Message Message
	Err     error
	// Delay is the wait before the next attempt.
	Delay time.Duration
}

// DeadLetteredEvent reports a message moved to the dead letters.
type DeadLetteredEvent struct {
	Message Message
	Err     error
}

// BacklogEvent reports the outbox's pending messages and dead letters.
type BacklogEvent struct {
	Stats outbox.Stats
}

// Relay drains an outbox into a Sink. Run several relays (processes, or
// Workers in one) side by side: each row is published by one of them, rows
// of one key in order. A Relay implements idemq.Service.
type Relay struct {
	pool    *pgxpool.Pool
	ob      *outbox.Outbox
	sink    Sink
	cfg     Config
	log     *slog.Logger
	sql     outboxsql.Queries
	listen  *pgx.ConnConfig
	state   lifecycle.State
	claimed atomic.Int64 // rows claimed since the last VACUUM
	vacuum  chan struct{}
	seqOID  uint32 // the outbox's identity sequence
	mon     *monitor
	// alive is when the workers' leases may run out, at the earliest (see
	// beat); nil before the first heartbeat.
	alive atomic.Pointer[time.Time]
}

// New validates cfg and returns a relay that publishes the rows of ob
// through sink (often a [*Router]), claiming them on pool.
func New(pool *pgxpool.Pool, ob *outbox.Outbox, sink Sink, cfg Config) (*Relay, error) {
	switch {
	case pool == nil:
		return nil, idemq.NewConfigError("relay", "pool", "is nil")
	case ob == nil:
		return nil, idemq.NewConfigError("relay", "outbox", "is nil")
	case nilcheck.IsNil(sink):
		return nil, idemq.NewConfigError("relay", "sink", "is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sql, err := outboxsql.For(ob.Config().Schema, ob.Config().Table)
	if err != nil {
		return nil, idemq.NewConfigError("relay", "outbox", "%v", err)
	}
	r := &Relay{
		pool:   pool,
		ob:     ob,
		sink:   sink,
		cfg:    cfg,
		log:    cfg.Logger.With("component", "idemq.relay", "outbox", ob.Config().Schema+"."+ob.Config().Table),
		sql:    sql,
		vacuum: make(chan struct{}, 1),
	}
	r.mon = newMonitor(r)
	if !cfg.DisableListen {
		if cfg.ListenConnString != "" {
			lc, err := pgx.ParseConfig(cfg.ListenConnString)
			if err != nil {
				return nil, idemq.NewConfigError("relay", "ListenConnString", "%v", err)
			}
			r.listen = lc
		} else {
			r.listen = pool.Config().ConnConfig.Copy()
		}
	}
	return r, nil
}

// Ready is closed once the current or next Run checked the outbox's tables
// and is listening (or, with DisableListen, claiming).
func (r *Relay) Ready() <-chan struct{} { return r.state.Ready() }

// Run publishes until ctx is done, then stops claiming, lets in-flight
// batches finish for up to Config.ShutdownGrace, releases what is still in
// flight and returns nil. Sink errors and passing database errors are
// logged and retried. Run returns an error when the outbox's tables are
// missing (run the migrations) or the pool is closed, and
// idemq.ErrRunning while another Run of r is active.
func (r *Relay) Run(ctx context.Context) error {
	ready, end, err := r.state.Begin()
	if err != nil {
		return err
	}
	defer end()
	if err := r.preflight(ctx); err != nil {
		if ctx.Err() != nil { // stopped before it started: a clean stop
			return nil
		}
		return err
	}
	ids := make([]uuid.UUID, r.cfg.Workers)
	for i := range ids {
		ids[i] = uuid.New()
	}
	beats, err := r.joinAll(ctx, ids)
	if err != nil {
		if ctx.Err() != nil { // stopped while it registered: a clean stop
			return nil
		}
		return err
	}
	defer beats.Close()
	// fatal ends the run for every goroutine when the tables vanish or the
	// pool is closed; the first such error is Run's.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fatalErr error
	var fatalOnce sync.Once
	fatal := func(err error) {
		fatalOnce.Do(func() { fatalErr = err })
		cancel()
	}
	// work outlives ctx by the grace period: it carries publishes and
	// commits of batches claimed before ctx was done.
	work, abandon := lifecycle.Grace(ctx, r.cfg.ShutdownGrace)
	defer abandon()

	r.log.Info("relay started", "workers", r.cfg.Workers, "batch", r.cfg.BatchSize, "listen", r.listen != nil)
	wakes := make([]chan struct{}, r.cfg.Workers)
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
	}
	wake := func() {
		for _, w := range wakes {
			select {
			case w <- struct{}{}:
			default:
			}
		}
	}
	var wg sync.WaitGroup
	if r.listen != nil {
		wg.Go(func() { r.listenLoop(ctx, wake, ready) })
	} else {
		ready()
	}
	wg.Go(func() { r.statsLoop(ctx) })
	if r.cfg.VacuumEvery > 0 {
		wg.Go(func() { r.vacuumLoop(ctx) })
	}
	stopBeats := lifecycle.KeepAlive(ctx, r.cfg.LeaseTTL/3, r.heartbeat(ctx, beats, ids))
	var workers sync.WaitGroup
	for i := range r.cfg.Workers {
		workers.Go(func() { r.workerLoop(ctx, work, wakes[i], ids[i], fatal) })
	}
	workers.Wait()
	abandon()
	wg.Wait()
	_ = stopBeats() // a heartbeat never reports a loss: the fence does
	if fatalErr != nil {
		r.log.Error("relay stopped", "err", fatalErr)
		return fatalErr
	}
	r.log.Info("relay stopped")
	return nil
}

// preflight checks that the pool is open, reaches a server that takes
// writes, and that the outbox's tables exist, and finds the outbox's
// sequence. A standby or a read-only server is a configuration mistake
// that retrying cannot mend: Run returns it at once.
func (r *Relay) preflight(ctx context.Context) error {
	var standby, readOnly, ok bool
	err := r.pool.QueryRow(ctx, r.sql.Writable).Scan(&standby, &readOnly)
	switch {
	case err != nil:
	case standby:
		return idemq.NewConfigError("relay", "pool", "reaches a standby (pg_is_in_recovery() is true), where nothing can be written: give the relay the primary (target_session_attrs=read-write in the connection string picks it)")
	case readOnly:
		return idemq.NewConfigError("relay", "pool", "reaches a read-only server (transaction_read_only is on, see default_transaction_read_only of the server, database or role): give the relay one where it can write")
	default:
		err = r.pool.QueryRow(ctx, r.sql.Exists, r.sql.Table, r.sql.Dead, r.sql.Lease).Scan(&ok)
	}
	if err == nil && ok {
		err = r.pool.QueryRow(ctx, r.sql.Sequence, r.sql.Table).Scan(&r.seqOID)
	}
	if err == nil && ok {
		var seq outbox.SequenceCheck
		if seq, err = r.ob.CheckSequence(ctx); err == nil {
			if err := seq.Err(); err != nil {
				return fmt.Errorf("relay: %w", err)
			}
		}
	}
	switch {
	case err != nil:
		if fatal := r.fatal(err); fatal != nil {
			return fatal
		}
		return fmt.Errorf("relay: check the outbox tables: %w", err)
	case !ok:
		return r.notMigrated()
	}
	return nil
}

func (r *Relay) notMigrated() error {
	return fmt.Errorf("relay: the outbox tables %s, %s and %s do not exist: run the migrations (outbox.Outbox.Migrate)", r.sql.Table, r.sql.Dead, r.sql.Lease)
}

// fatal returns the error that ends Run for err, nil when err is worth
// retrying: a closed pool, a missing table or schema (the migrations did
// not run, or someone dropped them), or a sequence set to CACHE > 1.
func (r *Relay) fatal(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, puddle.ErrClosedPool):
		return fmt.Errorf("relay: the pool is closed: %w", err)
	case errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000"): // undefined_table, invalid_schema_name
		return fmt.Errorf("%w: %w", r.notMigrated(), err)
	case errors.Is(err, outbox.ErrSequence):
		return err
	}
	return nil
}

// errRetry spaces the attempts of a worker or listener whose database
// calls fail, without bound (errRetry.BackOff never stops).
var errRetry = idemq.Retry{BaseDelay: 100 * time.Millisecond, MaxDelay: 30 * time.Second}

func (r *Relay) workerLoop(ctx, work context.Context, wake <-chan struct{}, id uuid.UUID, fatal func(error)) {
	w := &worker{r: r, id: id, win: newWindow(time.Now())}
	defer w.leave(ctx)
	// The worker's loop runs on after a success, so it takes the delays of
	// a BackOff rather than running under backoff.RetryNotify.
	back := errRetry.BackOff()
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	// Writers coalesce NOTIFYs (outbox.Config.NotifyInterval): after any
	// sign of traffic the worker polls at that interval for a while, which
	// finds the rows of transactions that skipped their NOTIFY.
	hotPoll := max(r.ob.Config().NotifyInterval, 0)
	if r.listen == nil {
		hotPoll = 0 // polling only: PollInterval is the whole story
	}
	hotFor := 50 * hotPoll
	var hotUntil time.Time
	for ctx.Err() == nil {
		claimed, more, err := w.round(ctx, work)
		if err != nil {
			w.unmark(nil, nil)
			if ctx.Err() != nil {
				return
			}
			if f := r.fatal(err); f != nil {
				fatal(f)
				return
			}
			d := back.NextBackOff()
			if errors.Is(err, errFenced) {
				// Not an outage: the heartbeat lapsed, or the claim's
				// answer came too late, and the batch let go of its rows.
				r.log.Warn("relay: a batch let its claimed rows go unpublished: the worker may have lost its partitions' leases; it takes them again if still theirs", "err", err, "retry_in", d)
			} else {
				r.mon.roundFailed(err, d)
			}
			_ = lifecycle.Sleep(ctx, d)
			continue
		}
		back.Reset()
		r.mon.roundOK()
		if claimed > 0 || more {
			hotUntil = time.Now().Add(hotFor)
			continue
		}
		wait := min(r.cfg.PollInterval, time.Until(w.rebalanceAt))
		if hotPoll > 0 && time.Now().Before(hotUntil) {
			wait = min(wait, hotPoll)
		}
		if at := w.win.back.at; !at.IsZero() {
			wait = min(wait, time.Until(at))
		}
		wait = max(wait, 0)
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-wake:
			hotUntil = time.Now().Add(hotFor)
		case <-poll.C:
		}
	}
}

// claimedRows counts rows claimed and asks for a VACUUM every
// Config.VacuumEvery rows.
func (r *Relay) claimedRows(n int) {
	if r.cfg.VacuumEvery <= 0 || n == 0 {
		return
	}
	if r.claimed.Add(int64(n)) >= int64(r.cfg.VacuumEvery) {
		select {
		case r.vacuum <- struct{}{}:
		default:
		}
	}
}

func (r *Relay) vacuumLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.vacuum:
		}
		r.claimed.Store(0)
		start := time.Now()
		if _, err := r.pool.Exec(ctx, r.sql.Vacuum, pgx.QueryExecModeSimpleProtocol); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("relay vacuum failed", "err", err)
			}
			continue
		}
		r.log.Debug("relay vacuumed the outbox", "took", time.Since(start))
	}
}

// statsLoop reads the backlog every StatsInterval, or less often when the
// read is slow: Stats scans the outbox, and a large backlog must not keep
// a server backend busy more than a tenth of the time.
func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTimer(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		start := time.Now()
		s, err := r.ob.Stats(ctx)
		t.Reset(max(r.cfg.StatsInterval, 10*time.Since(start)))
		if err == nil {
			r.mon.backlog(s)
			if h := r.cfg.Hooks.OnBacklog; h != nil {
				h(BacklogEvent{Stats: s})
			}
		} else if ctx.Err() == nil {
			r.log.Warn("relay stats failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// listenLoop keeps a dedicated connection LISTENing and calls wake on
// every notification and after every (re)connect. It calls ready once the
// first attempt to listen succeeded or failed: a relay polls meanwhile.
func (r *Relay) listenLoop(ctx context.Context, wake, ready func()) {
	channel := pgx.Identifier{r.ob.Config().Channel}.Sanitize()
	back := backoff.WithContext(errRetry.BackOff(), ctx)
	// listen returns only once the connection is lost (or ctx is done), so
	// RetryNotify reconnects until ctx is done; a connection that listened
	// starts the backoff afresh.
	listen := func() error {
		conn, err := pgx.ConnectConfig(ctx, r.listen.Copy())
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
			return err
		}
		ready()
		back.Reset()
		wake() // notifications sent while we were away are lost
		probe := r.startListenProbe(ctx, r.ob.Config().Channel)
		defer probe.stop()
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return err
			}
			probe.notified(n.Payload)
			wake()
		}
	}
	_ = backoff.RetryNotify(listen, back, func(err error, d time.Duration) {
		ready()
		r.log.Warn("relay listener lost its connection; polling meanwhile", "err", err, "retry_in", d)
	})
}
