package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/internal/retry"
	"github.com/idemq/idemq/outbox"
)

// Config configures a [Relay]. Zero values mean the documented defaults.
type Config struct {
	// BatchSize is the most rows one claim takes. Defaults to 500. Each
	// distinct key of a batch holds one advisory lock while the batch is in
	// flight, so Workers×BatchSize across all relays must fit the server's
	// lock table (max_locks_per_transaction × max_connections).
	BatchSize int
	// Workers is the number of batches this relay has in flight at once,
	// each on its own connection. The workers split the ordering keys
	// among themselves by hash (unkeyed rows go to whichever is free), so
	// more workers help when there are many keys and a slow Sink. Defaults
	// to 1.
	Workers int
	// PollInterval is how often an idle relay looks for due rows without
	// being woken by NOTIFY (retries falling due, missed notifications).
	// Defaults to 1 second.
	PollInterval time.Duration
	// RescanInterval is how often a busy relay scans the outbox from its
	// start again instead of from where its last batch began, to pick up
	// rows of transactions that committed late. Defaults to 1 second.
	RescanInterval time.Duration
	// RetryBase and RetryCap shape the exponential backoff with full
	// jitter between attempts: the n-th retry waits a random duration in
	// [0, min(RetryCap, RetryBase·2^(n-1))], or longer if the Sink's error
	// carries an idemq.RetryAfter hint. Default 1 second and 5 minutes.
	RetryBase time.Duration
	RetryCap  time.Duration
	// MaxAttempts is the number of failed publishes after which a message
	// becomes a dead letter. Defaults to 10. Errors marked with
	// idemq.Permanent dead-letter at once.
	MaxAttempts int
	// ParkFollowers keeps the later messages of a key waiting while an
	// earlier message of that key is a dead letter, until the dead letter
	// is replayed or purged (outbox.Replay, outbox.Purge). By default they
	// proceed.
	ParkFollowers bool
	// PublishTimeout bounds one Sink call. The claimed rows stay locked in
	// an open transaction meanwhile; the server ends that transaction
	// (idle_in_transaction_session_timeout) if the relay vanishes without
	// closing its connection. Defaults to 30 seconds.
	PublishTimeout time.Duration
	// ShutdownGrace is how long in-flight batches may finish after Run's
	// context is done; batches still publishing then are abandoned and their
	// rows released for the next relay. Defaults to 10 seconds.
	ShutdownGrace time.Duration
	// ListenConnString is the connection LISTEN uses: a direct connection
	// to the server, since LISTEN does not work through a
	// transaction-pooling proxy. Defaults to the pool's configuration.
	ListenConnString string
	// DisableListen makes the relay poll only.
	DisableListen bool
	// StatsInterval is how often [Hooks.Backlog] is called. Defaults to 15
	// seconds; ignored without that hook.
	StatsInterval time.Duration
	// VacuumEvery makes the relay VACUUM the outbox table after it has
	// claimed this many rows, one VACUUM at a time, in the background. A
	// queue table churns through dead tuples; every claim steps over those
	// at the low end of the primary key and of each key's index range until
	// vacuum removes them, so where autovacuum is off or slow (it is off on
	// some servers, and its default trigger waits for 20% of the table) the
	// claims slow down without bound. Defaults to 100,000; negative turns it
	// off (leave it to autovacuum and the per-table settings the migration
	// sets). Needs the table owner's rights; failures are logged.
	VacuumEvery int
	// Hooks receive metrics. All optional.
	Hooks Hooks
	// Logger receives errors and lifecycle events. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Hooks are optional metric callbacks. They run on the relay's goroutines
// and must be quick and safe for concurrent use.
type Hooks struct {
	// Published is called after a batch committed, with the delivered
	// messages and the duration of the Sink call. Message.CreatedAt gives
	// the age at delivery.
	Published func(msgs []Message, publish time.Duration)
	// Failed is called for every message whose publish failed, before it
	// is retried or dead-lettered.
	Failed func(msg Message, err error)
	// Retried is called for a failed message rescheduled after delay.
	Retried func(msg Message, err error, delay time.Duration)
	// DeadLettered is called for a message moved to the dead letters.
	DeadLettered func(msg Message, err error)
	// Backlog is called every Config.StatsInterval with the pending count
	// and the age of the oldest pending message.
	Backlog func(stats outbox.Stats)
}

// Relay drains an outbox into a Sink. Run several relays (processes, or
// Workers in one) side by side: each row is published by one of them, rows
// of one key in order.
type Relay struct {
	pool    *pgxpool.Pool
	ob      *outbox.Outbox
	sink    Sink
	cfg     Config
	policy  retry.Policy
	log     *slog.Logger
	sql     statements
	listen  *pgx.ConnConfig
	running atomic.Bool
	claimed atomic.Int64 // rows claimed since the last VACUUM
	vacuum  chan struct{}
}

// New validates cfg and returns a relay that publishes the rows of ob
// through sink (often a [*Router]).
func New(pool *pgxpool.Pool, ob *outbox.Outbox, sink Sink, cfg Config) (*Relay, error) {
	if pool == nil || ob == nil || sink == nil {
		return nil, errors.New("relay: New needs a pool, an outbox and a sink")
	}
	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"PollInterval", &cfg.PollInterval, time.Second},
		{"RescanInterval", &cfg.RescanInterval, time.Second},
		{"RetryBase", &cfg.RetryBase, time.Second},
		{"RetryCap", &cfg.RetryCap, 5 * time.Minute},
		{"PublishTimeout", &cfg.PublishTimeout, 30 * time.Second},
		{"ShutdownGrace", &cfg.ShutdownGrace, 10 * time.Second},
		{"StatsInterval", &cfg.StatsInterval, 15 * time.Second},
	}
	for _, d := range durations {
		if *d.v < 0 {
			return nil, fmt.Errorf("relay: %s %v is negative", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"BatchSize", &cfg.BatchSize, 500},
		{"Workers", &cfg.Workers, 1},
		{"MaxAttempts", &cfg.MaxAttempts, 10},
	}
	if cfg.VacuumEvery == 0 {
		cfg.VacuumEvery = 100_000
	}
	for _, d := range ints {
		if *d.v < 0 {
			return nil, fmt.Errorf("relay: %s %d is negative", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.RetryCap < cfg.RetryBase {
		return nil, fmt.Errorf("relay: RetryCap %v is below RetryBase %v", cfg.RetryCap, cfg.RetryBase)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Relay{
		pool:   pool,
		ob:     ob,
		sink:   sink,
		cfg:    cfg,
		policy: retry.Policy{Base: cfg.RetryBase, Cap: cfg.RetryCap},
		log:    cfg.Logger.With("component", "idemq.relay", "outbox", ob.Table()),
		sql:    newStatements(ob, cfg.ParkFollowers),
		vacuum: make(chan struct{}, 1),
	}
	if !cfg.DisableListen {
		if cfg.ListenConnString != "" {
			lc, err := pgx.ParseConfig(cfg.ListenConnString)
			if err != nil {
				return nil, fmt.Errorf("relay: ListenConnString: %w", err)
			}
			r.listen = lc
		} else {
			r.listen = pool.Config().ConnConfig.Copy()
		}
	}
	return r, nil
}

// ErrRunning is returned by Run on a relay that is already running.
var ErrRunning = errors.New("relay: already running")

// Run publishes until ctx is done, then stops claiming, lets in-flight
// batches finish for up to Config.ShutdownGrace, releases what is still in
// flight and returns nil. Database and sink errors are logged and retried,
// never returned: Run returns an error only if the relay is already
// running.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.running.Store(false)

	// work outlives ctx by the grace period: it carries publishes and
	// commits of batches claimed before ctx was done.
	work, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	stopGrace := context.AfterFunc(ctx, func() {
		t := time.NewTimer(r.cfg.ShutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			abandon()
		case <-work.Done():
		}
	})
	defer stopGrace()

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
		wg.Go(func() { r.listenLoop(ctx, wake) })
	}
	if r.cfg.Hooks.Backlog != nil {
		wg.Go(func() { r.statsLoop(ctx) })
	}
	if r.cfg.VacuumEvery > 0 {
		wg.Go(func() { r.vacuumLoop(ctx) })
	}
	var workers sync.WaitGroup
	for i := range r.cfg.Workers {
		workers.Go(func() { r.workerLoop(ctx, work, wakes[i], i) })
	}
	workers.Wait()
	abandon()
	wg.Wait()
	r.log.Info("relay stopped")
	return nil
}

func (r *Relay) workerLoop(ctx, work context.Context, wake <-chan struct{}, part int) {
	w := &worker{r: r, part: part}
	errDelay := retry.Policy{Base: 100 * time.Millisecond, Cap: 30 * time.Second}
	failures := 0
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	// Writers coalesce NOTIFYs (outbox.Config.NotifyInterval): after any
	// sign of traffic the worker polls at that interval for a while, which
	// finds the rows of transactions that skipped their NOTIFY.
	hotPoll := r.ob.NotifyInterval()
	if r.listen == nil {
		hotPoll = 0 // polling only: PollInterval is the whole story
	}
	hotFor := 50 * hotPoll
	var hotUntil time.Time
	for ctx.Err() == nil {
		claimed, err := w.batch(ctx, work)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			d := errDelay.Delay(failures)
			r.log.Warn("relay batch failed", "err", err, "retry_in", d)
			_ = retry.Sleep(ctx, d)
			continue
		}
		failures = 0
		if claimed > 0 {
			hotUntil = time.Now().Add(hotFor)
			continue
		}
		wait := r.cfg.PollInterval
		if hotPoll > 0 && time.Now().Before(hotUntil) {
			wait = min(wait, hotPoll)
		}
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
		if _, err := r.pool.Exec(ctx, "VACUUM "+r.ob.Table(), pgx.QueryExecModeSimpleProtocol); err != nil {
			if ctx.Err() == nil {
				r.log.Warn("relay vacuum failed", "err", err)
			}
			continue
		}
		r.log.Debug("relay vacuumed the outbox", "took", time.Since(start))
	}
}

func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.StatsInterval)
	defer t.Stop()
	for {
		s, err := r.ob.Stats(ctx, r.pool)
		if err == nil {
			r.cfg.Hooks.Backlog(s)
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
// every notification and after every (re)connect.
func (r *Relay) listenLoop(ctx context.Context, wake func()) {
	channel := pgx.Identifier{r.ob.Channel()}.Sanitize()
	policy := retry.Policy{Base: 100 * time.Millisecond, Cap: 10 * time.Second}
	failures := 0
	for ctx.Err() == nil {
		err := func() error {
			conn, err := pgx.ConnectConfig(ctx, r.listen.Copy())
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
				return err
			}
			failures = 0
			wake() // notifications sent while we were away are lost
			for {
				if _, err := conn.WaitForNotification(ctx); err != nil {
					return err
				}
				wake()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		failures++
		d := policy.Delay(failures)
		r.log.Warn("relay listener lost its connection; polling meanwhile", "err", err, "retry_in", d)
		_ = retry.Sleep(ctx, d)
	}
}
