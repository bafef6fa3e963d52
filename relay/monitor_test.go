package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// logs captures a relay's log as JSON lines.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// lines returns the records whose message starts with msg and whose
// attributes include attrs (compared as text).
func (l *logs) lines(t testing.TB, msg string, attrs ...string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	data := bytes.Clone(l.buf.Bytes())
	l.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m, _ := rec["msg"].(string); !strings.HasPrefix(m, msg) {
			continue
		}
		match := true
		for i := 0; i+1 < len(attrs); i += 2 {
			match = match && fmt.Sprint(rec[attrs[i]]) == attrs[i+1]
		}
		if match {
			out = append(out, rec)
		}
	}
	return out
}

// count asserts that exactly want records match.
func (l *logs) count(t testing.TB, want int, msg string, attrs ...string) {
	t.Helper()
	if got := l.lines(t, msg, attrs...); len(got) != want {
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
	if err := router.Route("d", relay.SinkFunc(func(ctx context.Context, batch []relay.Message) error {
		if down.Load() {
			return errors.New("broker unreachable")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	var out logs
	r := newRelay(t, b, router, relay.Config{
		Logger: out.logger(), ListenConnString: direct, StatsInterval: 20 * time.Millisecond,
		Retry: idemq.Retry{BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 1000},
		Hooks: relay.Hooks{OnFailed: func(relay.FailedEvent) { failed.Add(1) }},
	})
	run(t, r)
	enqueue(t, bd, keyed("d", 100, 100, 0)...)
	for i := range 5 {
		enqueue(t, bd, outbox.Message{Destination: "nowhere", Key: fmt.Sprint("n", i)})
	}
	waitFor(t, "several failed rounds", func() bool { return failed.Load() >= 300 })
	waitFor(t, "a backlog line", func() bool { return len(out.lines(t, "relay: backlog", "unrouted", "5")) > 0 })
	down.Store(false)
	waitFor(t, "the outage's end", func() bool { return pending(t, bd) == 5 })
	waitFor(t, "the outage's end logged", func() bool { return len(out.lines(t, "relay: broker outage over")) > 0 })

	out.count(t, 1, "relay: broker outage began", "destination", "d", "err", "broker unreachable")
	out.count(t, 1, "relay: broker outage over", "destination", "d")
	out.count(t, 1, "relay: holding the messages of a destination", "destination", "nowhere", "reason", relay.HoldNoRoute)
	out.count(t, 1, "relay: partitions acquired")
	if got := out.lines(t, "relay: partitions acquired"); len(got) == 1 {
		if parts, _ := got[0]["partitions"].([]any); len(parts) != 64 {
			t.Errorf("acquired %d partitions, want 64", len(parts))
		}
	}

	// The database goes away for a while and comes back.
	proxy.Stop()
	waitFor(t, "the database outage logged", func() bool { return len(out.lines(t, "relay: database unavailable")) > 0 })
	proxy.Start()
	enqueue(t, bd, keyed("d", 1, 1, 0)...)
	waitFor(t, "the database back", func() bool { return len(out.lines(t, "relay: database available again")) > 0 })
	waitFor(t, "the new message published", func() bool { return pending(t, bd) == 5 })
	out.count(t, 1, "relay: database unavailable")
	out.count(t, 1, "relay: database available again")
	out.count(t, 1, "relay: broker outage began")
	out.count(t, 0, "relay: partitions lost")
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
	var out logs
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{
		Logger: out.logger(), StatsInterval: 20 * time.Millisecond, StallThreshold: 200 * time.Millisecond,
		PollInterval: 20 * time.Millisecond,
	}))
	waitFor(t, "the stall logged", func() bool { return len(out.lines(t, "relay: stalled")) > 0 })
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the message published", func() bool { return len(rec.deliveries()) == 1 })
	waitFor(t, "the stall's end logged", func() bool { return len(out.lines(t, "relay: stall over")) > 0 })
	out.count(t, 1, "relay: stalled")
	out.count(t, 1, "relay: stall over")
	out.count(t, 1, "relay: backlog drained")
}
