package relay_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
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

// busyPoolEnv sets how long TestBusyPoolKeepsLeases watches the leases;
// `make soak` sets it to a minute.
const busyPoolEnv = "IDEMQ_RELAY_BUSY_POOL"

// TestBusyPoolKeepsLeases runs 48 workers on a pool of 4 connections into
// a Sink that takes 400 ms, while rows of every partition keep coming: the
// work pool is always exhausted, and every batch holds a connection for the
// whole publish. The workers' leases must still be renewed on time, so
// that no partition changes hands after its first take (its token stays
// 1): a hand-over of a live worker's partition is a window for a double
// publish and a reorder.
func TestBusyPoolKeepsLeases(t *testing.T) {
	watch := 15 * time.Second
	if v := os.Getenv(busyPoolEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", busyPoolEnv, v, err)
		}
		watch = d
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	b := setupOn(t, openPool(t, cfg))
	pool, ob := b.pool, b.ob

	var batches atomic.Int64
	sink := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, _ []relay.Message) error {
		batches.Add(1)
		select {
		case <-time.After(400 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Rows of 256 keys (every partition) keep coming, so that every
	// worker always has a batch to publish.
	feed, stopFeed := context.WithCancel(ctx)
	var fed sync.WaitGroup
	fed.Go(func() {
		for from := 0; feed.Err() == nil; from += 256 {
			err := pgx.BeginFunc(feed, pool, func(tx pgx.Tx) error { return ob.EnqueueTx(feed, tx, keyed("d", 256, 256, from)...) })
			if err != nil && feed.Err() == nil {
				t.Error(err)
				return
			}
			select {
			case <-feed.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() { stopFeed(); fed.Wait() })

	stop := run(t, newRelay(t, b, sink, relay.Config{Workers: 48, BatchSize: 50, LeaseTTL: 2 * time.Second}))
	defer stop()
	const lease = "idemq_outbox_lease"
	idemqtest.WaitFor(t, "every partition owned", func() bool {
		var owned int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+lease+` WHERE owner IS NOT NULL`).Scan(&owned)
		return err == nil && owned == 64
	})
	time.Sleep(watch)
	before := batches.Load()
	rows, err := pool.Query(ctx, `SELECT part, token FROM `+lease+` WHERE token <> 1 ORDER BY part`)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Part, Token int64 }])
	if err != nil {
		t.Fatal(err)
	}
	handOvers := int64(0)
	for _, m := range moved {
		handOvers += m.Token - 1
	}
	if len(moved) > 0 {
		t.Fatalf("%d hand-overs beyond the first take in %v (partition, token): %v", handOvers, watch, moved)
	}
	if before < int64(watch/time.Second) {
		t.Fatalf("only %d batches published in %v: the pool was not busy", before, watch)
	}
	t.Logf("%d batches in %v, no hand-over", before, watch)
}

// claimStaller is a pgx tracer that stalls a proxy as soon as an armed
// connection sends the claim (the DELETE of a batch), and reports when the
// claim's answer came back.
type claimStaller struct {
	proxy   *testenv.Proxy
	armed   atomic.Bool
	stalled chan struct{} // closed once the claim was sent into the stall
	ended   chan struct{} // closed once its answer was read
	claim   atomic.Pointer[pgx.Conn]
}

func (c *claimStaller) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(strings.TrimSpace(data.SQL), "DELETE FROM") && c.armed.CompareAndSwap(true, false) {
		c.proxy.Stall()
		c.claim.Store(conn)
		close(c.stalled)
	}
	return ctx
}

func (c *claimStaller) TraceQueryEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	if c.claim.CompareAndSwap(conn, nil) {
		close(c.ended)
	}
}

// TestStalledOwnerDoesNotPublishAfterItsSuccessor stalls relay A's network
// (a proxy holds back everything the server sends it) right after A sent
// the claim of a batch of key k: the server runs the claim, but its answer
// waits. A's heartbeat stops landing, its workers' rows expire, the server
// ends A's idle batch, and relay B takes A's partitions over and publishes
// k's rows. Then the network delivers again and A gets its claim's answer,
// long after it sent it: A must not publish anything after B's first
// publish of k (it would be a message of k published after a later one).
func TestStalledOwnerDoesNotPublishAfterItsSuccessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.PostgresURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	direct := setupOn(t, openPool(t, cfg.Copy()))

	// A reaches the server through the proxy.
	proxy := testenv.NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	staller := &claimStaller{proxy: proxy, stalled: make(chan struct{}), ended: make(chan struct{})}
	host, port, _ := net.SplitHostPort(proxy.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Tracer = host, uint16(p), staller
	// One connection, so that the claim's statement is prepared on it by a
	// first batch: the claim that meets the stall then reaches the server
	// whole and runs there.
	cfg.MaxConns = 1
	viaProxy := openPool(t, cfg)

	type publish struct {
		relay string
		at    time.Time
		msg   relay.Message
	}
	var mu sync.Mutex
	var published []publish
	sink := func(name string) relay.Sink {
		return relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range batch {
				published = append(published, publish{name, time.Now(), m})
			}
			return nil
		})
	}
	cfgRelay := relay.Config{DisableListen: true, PollInterval: 50 * time.Millisecond, LeaseTTL: 2 * time.Second, PublishTimeout: time.Second}
	stopA := run(t, newRelay(t, bundle{ctx, viaProxy, direct.ob}, sink("A"), cfgRelay))
	idemqtest.WaitFor(t, "A owning every partition", func() bool {
		var owned int
		err := direct.pool.QueryRow(ctx, `SELECT count(*) FROM idemq_outbox_lease WHERE owner IS NOT NULL`).Scan(&owned)
		return err == nil && owned == 64
	})
	enqueue(t, direct, outbox.Message{Destination: "d", Payload: []byte("first")})
	idemqtest.WaitFor(t, "A's first batch", func() bool { return pending(t, direct) == 0 })
	staller.armed.Store(true)
	enqueue(t, direct, keyed("d", 5, 1, 0)...)
	<-staller.stalled

	run(t, newRelay(t, direct, sink("B"), cfgRelay))
	var first time.Time
	idemqtest.WaitFor(t, "B's first publish of k0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range published {
			if p.relay == "B" && p.msg.Key != "" {
				first = p.at
				return true
			}
		}
		return false
	})
	proxy.Resume()
	select {
	case <-staller.ended:
	case <-time.After(60 * time.Second):
		t.Fatal("A's claim never got its answer")
	}
	stopA() // A finishes the batch it was in, publishing or not
	idemqtest.WaitFor(t, "B publishing every row", func() bool { return pending(t, direct) == 0 })

	mu.Lock()
	defer mu.Unlock()
	var b []relay.Message
	for _, p := range published {
		if p.relay == "A" && !p.at.Before(first) {
			t.Errorf("A published %s %v after B's first publish of its partition", p.msg.Payload, p.at.Sub(first))
		}
		if p.relay == "B" && p.msg.Key != "" {
			b = append(b, p.msg)
		}
	}
	if len(b) != 5 {
		t.Errorf("B published %d messages, want the 5 A had claimed", len(b))
	}
	checkOrder(t, b)
}

// TestReadOnlyDatabaseFailsAtStart gives the relay a database whose
// transactions are read-only, as on a standby or a server in read-only
// mode: Run returns an error that says so at once, instead of retrying
// batches that can never write.
func TestReadOnlyDatabaseFailsAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	b.pool.Reset() // new connections are read-only
	err := startErr(t, b)
	if !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("Run on a read-only database: %v; want an ErrConfig error at start that says read-only", err)
	}
	t.Log(err)
}

// TestSequenceCacheRefusedAtStart: with CACHE > 1 on the outbox's
// sequence, sessions hand out seqs out of order and the sequence's last
// value runs ahead of seqs still to come, so the horizon would let a
// cursor pass rows not written yet. The relay refuses to start and says
// how to fix it.
func TestSequenceCacheRefusedAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE `+b.table()+` ALTER COLUMN seq SET CACHE 20`); err != nil {
		t.Fatal(err)
	}
	err := startErr(t, b)
	if !errors.Is(err, outbox.ErrSequence) || !strings.Contains(err.Error(), "SET CACHE 1") {
		t.Fatalf("Run with a sequence of CACHE 20: %v; want outbox.ErrSequence at start, saying SET CACHE 1", err)
	}
}

// TestRestartedSequenceAtStart: dead letters keep their seq, so after
// TRUNCATE ... RESTART IDENTITY of the outbox alone they sit above the
// sequence, and a replay would put them behind later messages of their
// key. The relay refuses to start and says how to move the sequence on.
func TestRestartedSequenceAtStart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue(t, b, keyed("d", 10, 2, 0)...)
	if _, err := b.pool.Exec(b.ctx, `WITH m AS (DELETE FROM `+b.table()+` RETURNING *)
INSERT INTO idemq_outbox_dead (seq, id, created_at, failed_at, attempts, destination, payload, key, headers, last_error)
SELECT seq, id, created_at, now(), 1, destination, payload, key, headers, 'refused' FROM m`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `TRUNCATE `+b.table()+` RESTART IDENTITY`); err != nil {
		t.Fatal(err)
	}
	err := startErr(t, b)
	if !errors.Is(err, outbox.ErrSequence) || !strings.Contains(err.Error(), "setval") {
		t.Fatalf("Run with dead letters above a restarted sequence: %v; want outbox.ErrSequence at start, saying setval", err)
	}
}

// TestTruncateRestartIdentityWhileRunning: the relay published rows up to
// some seq, then the outbox is emptied with TRUNCATE ... RESTART IDENTITY
// and new rows start again at seq 1, below the workers' cursors and
// horizon. The relay notices (the sequence fell below what it saw, the
// table has a new file) and reads from the start: the new rows are
// published, in order, without waiting for a rescan.
func TestTruncateRestartIdentityWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{BatchSize: 20, Workers: 2, RescanInterval: time.Hour}))
	enqueue(t, b, keyed("d", 200, 10, 0)...)
	idemqtest.WaitFor(t, "the first 200", func() bool { return distinct(rec) == 200 })
	if _, err := b.pool.Exec(b.ctx, `TRUNCATE `+b.table()+` RESTART IDENTITY`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, b, keyed("d", 100, 10, 200)...)
	idemqtest.WaitFor(t, "the 100 enqueued after the truncate", func() bool { return distinct(rec) == 300 })
	checkOrder(t, rec.deliveries())
}

// TestPreparedTransactionKeepsItsPlace: a two-phase commit's transaction
// enqueues k:0 and is prepared (PREPARE TRANSACTION; the Outbox sends no
// NOTIFY, which would make it unpreparable). While it is prepared, no
// session runs it, but it still holds the outbox's lock, so the horizon
// waits for it although other rows keep being published. Once COMMIT
// PREPARED made k:0 visible, k:1, enqueued after that, must not overtake
// it.
func TestPreparedTransactionKeepsItsPlace(t *testing.T) {
	t.Parallel()
	srv := testenv.PrivatePostgres(t, "max_prepared_transactions=10")
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, openPool(t, cfg))
	pool := b.pool
	ob, err := outbox.New(pool, outbox.Config{DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	b.ob = ob
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnqueueTx(ctx, tx, outbox.Message{Destination: "d", Key: "k", Payload: []byte("k:0")}); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `PREPARE TRANSACTION 'enqueue-k0'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(ctx, `ROLLBACK PREPARED 'enqueue-k0'`) })
	conn.Close(ctx) // the prepared transaction outlives its session
	// The relay starts once the transaction is prepared: it has no session
	// then, so its locks have no pid.
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{DisableListen: true, PollInterval: 20 * time.Millisecond, RescanInterval: time.Hour}))
	for i := range 5 {
		enqueue(t, b, keyed("d", 20, 5, i*20)...)
		idemqtest.WaitFor(t, "other keys published while k:0 is prepared", func() bool { return distinct(rec) == (i+1)*20 })
	}
	if _, err := pool.Exec(ctx, `COMMIT PREPARED 'enqueue-k0'`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, b, outbox.Message{Destination: "d", Key: "k", Payload: []byte("k:1")})
	idemqtest.WaitFor(t, "k:1 published", func() bool {
		for _, m := range rec.deliveries() {
			if string(m.Payload) == "k:1" {
				return true
			}
		}
		return false
	})
	checkOrder(t, rec.deliveries())
	if n := distinct(rec); n != 102 {
		t.Fatalf("k:1 published, and %d messages in all, want 102: k:0 was overtaken", n)
	}
}

// openPool opens a pool by cfg, closed at cleanup.
func openPool(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// startErr runs a relay on b and returns Run's error, which must come
// before Run has run for 30 seconds: an error at start.
func startErr(t *testing.T, b bundle) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err := newRelay(t, b, &recorder{}, relay.Config{}).Run(ctx)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("Run returned %v after %v, want an error at start", err, 30*time.Second)
	}
	return err
}
