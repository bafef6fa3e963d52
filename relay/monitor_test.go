package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// wantLines asserts that exactly want records of out match.
func wantLines(t testing.TB, out *testenv.Logs, want int, msg string, attrs ...string) {
	t.Helper()
	if got := out.Records(msg, attrs...); len(got) != want {
		t.Errorf("%d log lines %q %v, want %d:\n%v", len(got), msg, attrs, want, got)
	}
}

// The relay logs once per change of state, not once per message: a broker
// outage of one destination that fails 100 messages for several rounds is
// one line when it begins and one when it ends; a destination no route
// matches is one line however often its messages come back; the partitions
// one worker acquired are one line; the backlog has its periodic line
// while messages are pending; and the database going away and coming
// back (a proxy in front of it stopped and started) is one line each.
func TestRelayLogsStateChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.PostgresURL(t)
	cfg, err := pgx.ParseConfig(direct)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, fmt.Sprintf("%s:%d", cfg.Host, cfg.Port))
	pcfg, err := pgxpool.ParseConfig(direct)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = host, uint16(p)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setupOn(t, pool)
	// The test's own reads and writes go around the proxy.
	directPool, err := pgxpool.New(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(directPool.Close)
	bd := bundle{ctx: ctx, pool: directPool, ob: mustOutbox(t, directPool)}

	var down atomic.Bool
	down.Store(true)
	var failed atomic.Int64
	router := relay.NewRouter()
	if err := router.Route("d", relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		if down.Load() {
			return errors.New("broker unreachable")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	// A destination that refuses its messages (permanent errors: dead
	// letters) is not failing.
	if err := router.Route("refusing", relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		return idemq.Permanent(errors.New("refused"))
	})); err != nil {
		t.Fatal(err)
	}
	var out testenv.Logs
	r := newRelay(t, b, router, relay.Config{
		Logger: out.Logger(), ListenConnString: direct, StatsInterval: 20 * time.Millisecond,
		Retry: idemq.Retry{BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 1000},
		Hooks: relay.Hooks{OnFailed: func(relay.FailedEvent) { failed.Add(1) }},
	})
	run(t, r)
	enqueue(t, bd, keyed("d", 100, 100, 0)...)
	for i := range 5 {
		enqueue(t, bd, outbox.Message{Destination: "nowhere", Key: fmt.Sprint("n", i)})
	}
	enqueue(t, bd, keyed("refusing", 3, 3, 0)...)
	idemqtest.WaitFor(t, "several failed rounds", func() bool { return failed.Load() >= 300 })
	idemqtest.WaitFor(t, "a backlog line", func() bool { return len(out.Records("relay: backlog", "unrouted", "5")) > 0 })
	down.Store(false)
	idemqtest.WaitFor(t, "the outage's end", func() bool { return pending(t, bd) == 5 })
	idemqtest.WaitFor(t, "the outage's end logged", func() bool { return len(out.Records("relay: destination failing no more")) > 0 })

	wantLines(t, &out, 1, "relay: destination failing:", "destination", "d", "err", "broker unreachable")
	wantLines(t, &out, 1, "relay: destination failing no more", "destination", "d")
	wantLines(t, &out, 0, "relay: destination failing:", "destination", "refusing")
	wantLines(t, &out, 1, "relay: holding the messages of a destination", "destination", "nowhere", "reason", relay.HoldNoRoute)
	wantLines(t, &out, 1, "relay: partitions acquired")
	if got := out.Records("relay: partitions acquired"); len(got) == 1 {
		if parts, tokens := got[0].Attrs["partitions"], got[0].Attrs["tokens"]; parts != "0-63" || tokens != "1" {
			t.Errorf("acquired partitions %s at tokens %s, want 0-63 at 1", parts, tokens)
		}
	}

	// The database goes away for a while and comes back.
	proxy.Stop()
	idemqtest.WaitFor(t, "the database outage logged", func() bool { return len(out.Records("relay: database unavailable")) > 0 })
	proxy.Start()
	enqueue(t, bd, keyed("d", 1, 1, 0)...)
	idemqtest.WaitFor(t, "the database back", func() bool { return len(out.Records("relay: database available again")) > 0 })
	idemqtest.WaitFor(t, "the new message published", func() bool { return pending(t, bd) == 5 })
	wantLines(t, &out, 1, "relay: database unavailable")
	wantLines(t, &out, 1, "relay: database available again")
	wantLines(t, &out, 1, "relay: destination failing:")
	wantLines(t, &out, 0, "relay: partitions lost")
}

// A due message that the relay cannot take (an outside session holds its
// row lock) is a stall once it has waited longer than StallThreshold: one
// line when it begins, one when it ends.
func TestRelayLogsStall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue(t, b, outbox.Message{Destination: "d", Key: "k", Payload: []byte("k:0")})
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // rolled back below
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM `+b.table()+` FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var out testenv.Logs
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{
		Logger: out.Logger(), StatsInterval: 20 * time.Millisecond, StallThreshold: 200 * time.Millisecond,
		PollInterval: 20 * time.Millisecond,
	}))
	idemqtest.WaitFor(t, "the stall logged", func() bool { return len(out.Records("relay: stalled")) > 0 })
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "the message published", func() bool { return len(rec.deliveries()) == 1 })
	idemqtest.WaitFor(t, "the stall's end logged", func() bool { return len(out.Records("relay: stall over")) > 0 })
	wantLines(t, &out, 1, "relay: stalled")
	wantLines(t, &out, 1, "relay: stall over")
	wantLines(t, &out, 1, "relay: backlog drained")
}
