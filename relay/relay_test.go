package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

func TestNewValidatesConfig(t *testing.T) {
	b := setup(t)
	for field, cfg := range map[string]relay.Config{
		"BatchSize":        {BatchSize: -1},
		"Retry.BaseDelay":  {Retry: idemq.Retry{BaseDelay: time.Minute, MaxDelay: time.Second}},
		"PollInterval":     {PollInterval: -time.Second},
		"ShutdownGrace":    {ShutdownGrace: -time.Second},
		"ListenConnString": {ListenConnString: "://bad"},
	} {
		_, err := relay.New(b.pool, b.ob, &recorder{}, cfg)
		var ce *idemq.ConfigError
		if !errors.As(err, &ce) || ce.Field != field || !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New(%+v): %v, want a ConfigError for %s", cfg, err, field)
		}
	}
	var nilRouter *relay.Router
	for name, sink := range map[string]relay.Sink{"nil": nil, "nil SinkFunc": relay.SinkFunc(nil), "nil *Router": nilRouter} {
		if _, err := relay.New(b.pool, b.ob, sink, relay.Config{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("New accepted a %s sink: %v", name, err)
		}
	}
	if _, err := relay.New(nil, b.ob, &recorder{}, relay.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("New accepted a nil pool: %v", err)
	}
	if _, err := relay.New(b.pool, nil, &recorder{}, relay.Config{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("New accepted a nil outbox: %v", err)
	}
}

func TestCommittedPublishedRolledBackNever(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{}))

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: "d", Payload: []byte("rolled back")}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	enqueue(t, b, outbox.Message{Destination: "d", Key: "k", Payload: []byte("committed"), Headers: map[string]string{"a": "b"}})
	idemqtest.WaitFor(t, "delivery", func() bool { return len(rec.deliveries()) == 1 })
	m := rec.deliveries()[0]
	if string(m.Payload) != "committed" || m.Key != "k" || m.Destination != "d" || m.Headers["a"] != "b" || m.ID.Version() != 7 || m.Attempts != 0 {
		t.Fatalf("delivered %+v", m)
	}
	idemqtest.WaitFor(t, "empty outbox", func() bool { return pending(t, b) == 0 })
	time.Sleep(100 * time.Millisecond)
	if n := len(rec.deliveries()); n != 1 {
		t.Fatalf("%d deliveries, want 1", n)
	}
}

func TestSinkFailingEverySecondCall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	failedAt := map[string]time.Time{}
	rec := &recorder{fn: func(call int, batch []relay.Message) error {
		if call%2 == 0 {
			mu.Lock()
			for _, m := range batch {
				failedAt[m.ID.String()] = time.Now()
			}
			mu.Unlock()
			return errors.New("broker unavailable")
		}
		return nil
	}}
	var retries atomic.Int64
	delays := make(chan time.Duration, 1000)
	cfg := relay.Config{
		BatchSize: 7, Retry: idemq.Retry{BaseDelay: 20 * time.Millisecond, MaxDelay: 80 * time.Millisecond, MaxAttempts: 100},
		Hooks: relay.Hooks{OnRetried: func(e relay.RetriedEvent) {
			d := e.Delay
			retries.Add(1)
			select {
			case delays <- d:
			default:
			}
		}},
	}
	r := newRelay(t, b, rec, cfg)

	// Watch available_at of the first failing batch from outside: it must
	// move forward.
	enqueue(t, b, keyed("d", 200, 10, 0)...)
	run(t, r)
	idemqtest.WaitFor(t, "all delivered", func() bool { return distinct(rec) == 200 && pending(t, b) == 0 })
	dups := checkOrder(t, rec.deliveries())
	if dups != 0 {
		t.Fatalf("%d duplicates without a crash", dups)
	}
	if retries.Load() == 0 {
		t.Fatal("no retries recorded")
	}
	// Backoff: every redelivery happened no earlier than its failure, the
	// drawn delays lie in [0, cap] and are not all equal (jitter).
	close(delays)
	seen := map[time.Duration]bool{}
	for d := range delays {
		if d < 0 || d > 80*time.Millisecond {
			t.Fatalf("delay %v outside [0, cap]", d)
		}
		seen[d] = true
	}
	if len(seen) < 2 {
		t.Fatalf("delays without jitter: %v", seen)
	}
	for _, m := range rec.deliveries() {
		if m.Attempts > 0 {
			mu.Lock()
			f, ok := failedAt[m.ID.String()]
			mu.Unlock()
			if !ok {
				t.Fatalf("message %s delivered with attempts %d but never failed", m.ID, m.Attempts)
			}
			_ = f
		}
	}
}

// TestBackoffMovesAvailableAtForward looks at the rows themselves: after a
// failure, attempts grow and available_at lies after the failure, no
// further than the backoff ceiling, with jitter between rows.
func TestBackoffMovesAvailableAtForward(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var fail atomic.Bool
	fail.Store(true)
	rec := &recorder{fn: func(int, []relay.Message) error {
		if fail.Load() {
			return errors.New("down")
		}
		return nil
	}}
	r := newRelay(t, b, rec, relay.Config{Retry: idemq.Retry{BaseDelay: time.Hour, MaxDelay: time.Hour, MaxAttempts: 5}})
	var msgs []outbox.Message
	for i := range 50 {
		msgs = append(msgs, outbox.Message{Destination: "d", Payload: fmt.Append(nil, i)})
	}
	enqueue(t, b, msgs...)
	before := time.Now()
	stop := run(t, r)
	var n int
	idemqtest.WaitFor(t, "first attempts", func() bool {
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM `+b.table()+` WHERE attempts = 1`).Scan(&n)
		return err == nil && n == 50
	})
	stop()
	rows, err := b.pool.Query(b.ctx, `SELECT available_at, last_error FROM `+b.table())
	if err != nil {
		t.Fatal(err)
	}
	distinctAt := map[time.Time]bool{}
	for rows.Next() {
		var at time.Time
		var lastErr string
		if err := rows.Scan(&at, &lastErr); err != nil {
			t.Fatal(err)
		}
		if at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Hour+time.Second)) || lastErr != "down" {
			t.Fatalf("available_at %v (started %v), last_error %q", at, before, lastErr)
		}
		distinctAt[at] = true
	}
	if len(distinctAt) < 40 {
		t.Fatalf("only %d distinct retry times for 50 rows: no jitter", len(distinctAt))
	}
}

func TestPermanentErrorDeadLettersThenReplayDelivers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var reject atomic.Bool
	reject.Store(true)
	rec := &recorder{fn: func(_ int, batch []relay.Message) error {
		pe := &relay.PublishError{Failed: map[int]error{}}
		for i, m := range batch {
			if reject.Load() && string(m.Payload) == "poison" {
				pe.Failed[i] = idemq.Permanent(errors.New("schema violation"))
			}
		}
		if len(pe.Failed) == 0 {
			return nil
		}
		return pe
	}}
	var dead atomic.Int64
	r := newRelay(t, b, rec, relay.Config{Retry: idemq.Retry{MaxAttempts: 10}, Hooks: relay.Hooks{OnDeadLettered: func(relay.DeadLetteredEvent) { dead.Add(1) }}})
	run(t, r)
	enqueue(t, b, outbox.Message{Destination: "d", Payload: []byte("poison")}, outbox.Message{Destination: "d", Payload: []byte("fine")})
	idemqtest.WaitFor(t, "dead letter", func() bool { return dead.Load() == 1 && pending(t, b) == 0 })
	dl, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
	if err != nil || len(dl) != 1 || string(dl[0].Payload) != "poison" || dl[0].Attempts != 1 || !strings.Contains(dl[0].LastError, "schema violation") {
		t.Fatalf("dead letters %+v %v", dl, err)
	}
	if len(rec.deliveries()) != 1 {
		t.Fatalf("deliveries %d", len(rec.deliveries()))
	}
	reject.Store(false)
	if n, err := b.ob.Replay(b.ctx, outbox.DeadFilter{IDs: []uuid.UUID{dl[0].ID}}); err != nil || n != 1 {
		t.Fatalf("replay %d %v", n, err)
	}
	idemqtest.WaitFor(t, "replayed delivery", func() bool { return len(rec.deliveries()) == 2 })
	if got := rec.deliveries()[1]; got.ID != dl[0].ID || string(got.Payload) != "poison" || got.Attempts != 0 {
		t.Fatalf("replayed %+v", got)
	}
}

func TestMaxAttemptsDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{fn: func(int, []relay.Message) error { return errors.New("always") }}
	r := newRelay(t, b, rec, relay.Config{Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, MaxAttempts: 3}})
	run(t, r)
	enqueue(t, b, outbox.Message{Destination: "d", Payload: []byte("x")})
	var dl []outbox.DeadLetter
	idemqtest.WaitFor(t, "dead letter", func() bool {
		dl, _ = b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
		return len(dl) == 1
	})
	if dl[0].Attempts != 3 || dl[0].LastError != "always" {
		t.Fatalf("dead letter %+v", dl[0])
	}
	rec.mu.Lock()
	calls := rec.calls
	rec.mu.Unlock()
	if calls != 3 {
		t.Fatalf("%d publish calls, want 3", calls)
	}
}

func TestRetryAfterHintHonoured(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{fn: func(call int, _ []relay.Message) error {
		if call == 1 {
			return idemq.RetryAfter(errors.New("429"), time.Hour)
		}
		return nil
	}}
	var delay atomic.Int64
	r := newRelay(t, b, rec, relay.Config{Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Hooks: relay.Hooks{OnRetried: func(e relay.RetriedEvent) { delay.Store(int64(e.Delay)) }}})
	run(t, r)
	enqueue(t, b, outbox.Message{Destination: "d"})
	idemqtest.WaitFor(t, "retry", func() bool { return delay.Load() != 0 })
	if time.Duration(delay.Load()) != time.Hour {
		t.Fatalf("delay %v, want the 1h hint", time.Duration(delay.Load()))
	}
	var later bool
	if err := b.pool.QueryRow(b.ctx, `SELECT available_at > now() + interval '59 minutes' FROM `+b.table()).Scan(&later); err != nil || !later {
		t.Fatalf("available_at not an hour ahead (%v)", err)
	}
}

func TestFailingKeyHoldsBackOnlyItsFollowers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var badFails atomic.Int64
	rec := &recorder{fn: func(_ int, batch []relay.Message) error {
		pe := &relay.PublishError{Failed: map[int]error{}}
		stop := false
		for i, m := range batch {
			if m.Key != "bad" {
				continue
			}
			if stop {
				pe.Failed[i] = relay.ErrSkipped
				continue
			}
			if badFails.Load() < 5 && string(m.Payload) == "bad:0" {
				badFails.Add(1)
				pe.Failed[i] = errors.New("downstream rejects bad:0 for now")
				stop = true
			}
		}
		if len(pe.Failed) == 0 {
			return nil
		}
		return pe
	}}
	var msgs []outbox.Message
	for i := range 20 {
		msgs = append(msgs, outbox.Message{Destination: "d", Key: "bad", Payload: fmt.Appendf(nil, "bad:%d", i)})
		msgs = append(msgs, outbox.Message{Destination: "d", Key: "good", Payload: fmt.Appendf(nil, "good:%d", i)})
		msgs = append(msgs, outbox.Message{Destination: "d", Payload: fmt.Appendf(nil, "free%d", i)})
	}
	enqueue(t, b, msgs...)
	r := newRelay(t, b, rec, relay.Config{BatchSize: 8, Retry: idemq.Retry{BaseDelay: 50 * time.Millisecond, MaxDelay: 100 * time.Millisecond}})
	run(t, r)
	// The good key and the unkeyed messages all get through while bad:0 is
	// still failing.
	idemqtest.WaitFor(t, "good key and unkeyed rows", func() bool {
		n := 0
		for _, m := range rec.deliveries() {
			if m.Key != "bad" {
				n++
			}
		}
		return n == 40
	})
	idemqtest.WaitFor(t, "bad key after recovery", func() bool { return distinct(rec) == 60 })
	if dups := checkOrder(t, rec.deliveries()); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	if badFails.Load() != 5 {
		t.Fatalf("bad:0 failed %d times", badFails.Load())
	}
	// bad:0 carries its attempts; its followers were never charged one.
	for _, m := range rec.deliveries() {
		if m.Key == "bad" && string(m.Payload) != "bad:0" && m.Attempts != 0 {
			t.Fatalf("%s delivered with %d attempts", m.Payload, m.Attempts)
		}
		if string(m.Payload) == "bad:0" && m.Attempts != 5 {
			t.Fatalf("bad:0 delivered with %d attempts, want 5", m.Attempts)
		}
	}
}

func TestDeadHeadFollowersProceedOrPark(t *testing.T) {
	for _, park := range []bool{false, true} {
		t.Run(fmt.Sprint("park=", park), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var poison atomic.Bool
			poison.Store(true)
			rec := &recorder{fn: func(_ int, batch []relay.Message) error {
				pe := &relay.PublishError{Failed: map[int]error{}}
				stop := false
				for i, m := range batch {
					if m.Key != "k" {
						continue
					}
					if stop {
						pe.Failed[i] = relay.ErrSkipped
					} else if poison.Load() && string(m.Payload) == "k:1" {
						pe.Failed[i] = idemq.Permanent(errors.New("poison"))
						stop = true
					}
				}
				if len(pe.Failed) == 0 {
					return nil
				}
				return pe
			}}
			r := newRelay(t, b, rec, relay.Config{ParkFollowers: park, BatchSize: 2})
			run(t, r)
			var msgs []outbox.Message
			for i := range 6 {
				msgs = append(msgs, outbox.Message{Destination: "d", Key: "k", Payload: fmt.Appendf(nil, "k:%d", i)},
					outbox.Message{Destination: "d", Key: "other", Payload: fmt.Appendf(nil, "other:%d", i)})
			}
			enqueue(t, b, msgs...)
			payloads := func() string {
				var s []string
				for _, m := range rec.deliveries() {
					if m.Key == "k" {
						s = append(s, string(m.Payload))
					}
				}
				return strings.Join(s, ",")
			}
			others := func() int {
				n := 0
				for _, m := range rec.deliveries() {
					if m.Key == "other" {
						n++
					}
				}
				return n
			}
			if !park {
				idemqtest.WaitFor(t, "followers", func() bool { return payloads() == "k:0,k:2,k:3,k:4,k:5" && others() == 6 })
				return
			}
			idemqtest.WaitFor(t, "others", func() bool { return others() == 6 })
			time.Sleep(200 * time.Millisecond)
			if p := payloads(); p != "k:0" {
				t.Fatalf("parked key delivered %q", p)
			}
			// New messages of a parked key wait too.
			enqueue(t, b, outbox.Message{Destination: "d", Key: "k", Payload: []byte("k:6")})
			time.Sleep(200 * time.Millisecond)
			if p := payloads(); p != "k:0" {
				t.Fatalf("parked key delivered %q", p)
			}
			poison.Store(false)
			if n, err := b.ob.Replay(b.ctx, outbox.DeadFilter{Key: "k"}); err != nil || n != 1 {
				t.Fatalf("replay %d %v", n, err)
			}
			idemqtest.WaitFor(t, "unparked", func() bool { return payloads() == "k:0,k:1,k:2,k:3,k:4,k:5,k:6" })
		})
	}
}

func TestRouter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orders, billing, other := &recorder{}, &recorder{}, &recorder{}
	router := relay.NewRouter()
	for _, err := range []error{
		router.Route("orders.created", orders),
		router.RoutePrefix("orders.", other),
		router.RoutePrefix("billing.", billing),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if router.Route("orders.created", orders) == nil {
		t.Fatal("duplicate route accepted")
	}
	var heldErr atomic.Value
	r := newRelay(t, b, router, relay.Config{Hooks: relay.Hooks{OnHeld: func(e relay.HeldEvent) { heldErr.Store(e.Err) }}})
	run(t, r)
	enqueue(t, b,
		outbox.Message{Destination: "orders.created", Key: "o1", Payload: []byte("o1:0")},
		outbox.Message{Destination: "orders.paid", Key: "o1", Payload: []byte("o1:1")},
		outbox.Message{Destination: "orders.created", Key: "o1", Payload: []byte("o1:2")},
		outbox.Message{Destination: "billing.invoice", Payload: []byte("inv")},
		outbox.Message{Destination: "nowhere", Payload: []byte("lost")},
	)
	idemqtest.WaitFor(t, "routing", func() bool {
		return len(orders.deliveries()) == 2 && len(other.deliveries()) == 1 && len(billing.deliveries()) == 1 && heldErr.Load() != nil
	})
	// A destination without a route is held, not dead-lettered.
	err := heldErr.Load().(error)
	if !errors.Is(err, relay.ErrNoRoute) || idemq.IsPermanent(err) || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Fatalf("hold error %v", err)
	}
	st, serr := b.ob.Stats(b.ctx)
	if serr != nil || st.Pending != 1 || st.Unrouted != 1 || st.Dead != 0 {
		t.Fatalf("stats %+v (%v), want the unrouted message pending and no dead letter", st, serr)
	}
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	rec := &recorder{fn: func(int, []relay.Message) error {
		once.Do(func() { close(entered) })
		<-release
		return nil
	}}
	r := newRelay(t, b, rec, relay.Config{ShutdownGrace: time.Minute})
	enqueue(t, b, keyed("d", 10, 3, 0)...)
	stop := run(t, r)
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	<-stopped
	if n := pending(t, b); n != 0 || len(rec.deliveries()) != 10 {
		t.Fatalf("%d pending, %d delivered after a graceful stop", n, len(rec.deliveries()))
	}
}

func TestHooks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{fn: func(call int, _ []relay.Message) error {
		if call == 1 {
			return errors.New("once")
		}
		return nil
	}}
	var published, failed, retried atomic.Int64
	var backlog atomic.Value
	r := newRelay(t, b, rec, relay.Config{
		Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}, StatsInterval: 10 * time.Millisecond,
		Hooks: relay.Hooks{
			OnPublished: func(e relay.PublishedEvent) { published.Add(int64(len(e.Messages))) },
			OnFailed:    func(relay.FailedEvent) { failed.Add(1) },
			OnRetried:   func(relay.RetriedEvent) { retried.Add(1) },
			OnBacklog:   func(e relay.BacklogEvent) { backlog.Store(e.Stats) },
		},
	})
	enqueue(t, b, keyed("d", 3, 3, 0)...)
	run(t, r)
	idemqtest.WaitFor(t, "hooks", func() bool { return published.Load() == 3 })
	if failed.Load() != 3 || retried.Load() != 3 {
		t.Fatalf("failed %d retried %d", failed.Load(), retried.Load())
	}
	idemqtest.WaitFor(t, "backlog hook", func() bool { s, ok := backlog.Load().(outbox.Stats); return ok && s.Pending == 0 })
}

func TestPollingWithoutListen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{DisableListen: true, PollInterval: 20 * time.Millisecond}))
	enqueue(t, b, outbox.Message{Destination: "d"})
	idemqtest.WaitFor(t, "polled delivery", func() bool { return len(rec.deliveries()) == 1 })
}

func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	// A poll interval far beyond the test: only notifications wake it.
	run(t, newRelay(t, b, rec, relay.Config{PollInterval: time.Hour}))
	enqueue(t, b, outbox.Message{Destination: "d", Payload: []byte("1")})
	idemqtest.WaitFor(t, "first", func() bool { return len(rec.deliveries()) == 1 })
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'`); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "listener back", func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&n)
		return n == 1
	})
	enqueue(t, b, outbox.Message{Destination: "d", Payload: []byte("2")})
	idemqtest.WaitFor(t, "second", func() bool { return len(rec.deliveries()) == 2 })
}

var _ = pgx.ErrNoRows
var _ = context.Background

// TestCoalescedNotifyDeliversEverything: concurrent writers skip most
// NOTIFYs (outbox.Config.NotifyInterval); the relay's polling after each
// wake-up finds every row (the slow poll is only a safety net for a
// machine so loaded that a transaction outlives the hot-polling window).
func TestCoalescedNotifyDeliversEverything(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{PollInterval: 5 * time.Second}))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
					return b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: "d", Key: fmt.Sprint("w", w), Payload: fmt.Appendf(nil, "w%d:%d", w, i)})
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	idemqtest.WaitFor(t, "800 deliveries", func() bool { return distinct(rec) == 800 })
	if dups := checkOrder(t, rec.deliveries()); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}

// TestRelayVacuums: with VacuumEvery set, the relay vacuums the outbox
// after that many claimed rows (autovacuum may be off on the server).
func TestRelayVacuums(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{VacuumEvery: 100}))
	enqueue(t, b, keyed("d", 300, 7, 0)...)
	idemqtest.WaitFor(t, "vacuum", func() bool {
		var n int64
		err := b.pool.QueryRow(b.ctx, `SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass`, b.table()).Scan(&n)
		return err == nil && n > 0
	})
	idemqtest.WaitFor(t, "deliveries", func() bool { return distinct(rec) == 300 })
}

// TestWorkersSplitKeys: several workers in one relay, splitting the keys
// among themselves, deliver everything once and in order per key.
func TestWorkersSplitKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	batches := 0
	rec := &recorder{fn: func(int, []relay.Message) error {
		mu.Lock()
		batches++
		mu.Unlock()
		time.Sleep(2 * time.Millisecond) // a broker round trip
		return nil
	}}
	run(t, newRelay(t, b, rec, relay.Config{Workers: 4, BatchSize: 50}))
	var msgs []outbox.Message
	msgs = append(msgs, keyed("d", 2000, 64, 0)...)
	for i := range 200 {
		msgs = append(msgs, outbox.Message{Destination: "d", Payload: fmt.Append(nil, i)})
	}
	enqueue(t, b, msgs...)
	idemqtest.WaitFor(t, "2,200 deliveries", func() bool { return distinct(rec) == 2200 })
	if dups := checkOrder(t, rec.deliveries()); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}
