package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// pooled is a test database reached through a PgBouncer of its own in
// transaction mode (pooled) and directly (direct, for LISTEN and for the
// test's own look at the tables).
type pooled struct {
	direct, pooled string
	directPool     *pgxpool.Pool
}

func setupPooled(t *testing.T) pooled {
	t.Helper()
	direct := testenv.PostgresURL(t)
	p := pooled{direct: direct, pooled: testenv.PgBouncer(t, direct)}
	var err error
	if p.directPool, err = pgxpool.New(context.Background(), direct); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.directPool.Close)
	return p
}

// pool opens a pool through the PgBouncer; trace, if set, sees every
// statement that ended.
func (p pooled) pool(t *testing.T, trace func(sql string)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(p.pooled)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 6
	if trace != nil {
		cfg.ConnConfig.Tracer = endTracer(trace)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// endTracer calls itself with the SQL of every query that ended.
type endTracer func(sql string)

type sqlKey struct{}

func (f endTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (f endTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, ok := ctx.Value(sqlKey{}).(string); ok {
		f(sql)
	}
}

// TestPgBouncer runs two relays and a consumer through PgBouncer 1.18 in
// transaction mode: the migrations, the relays' claims and the consumer's
// inbox all go through it, LISTEN goes to the server directly
// (ListenConnString). The relays never poll (PollInterval and LeaseTTL so
// long that neither a poll nor a rebalance comes before the deadline), so
// every batch is published because a NOTIFY, sent through the pooler by
// EnqueueTx, woke them. Every message is applied once, in order per key.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	pool := p.pool(t, nil)
	b := setupOn(t, pool)
	ctx := b.ctx
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (seq bigserial PRIMARY KEY, id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(pool, "pgbouncer", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (id) VALUES ($1)`, msg.ID)
		return err
	}, consumer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var delivered []relay.Message
	sink := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		f := relay.NewFailures(batch)
		for i, m := range batch {
			if f.Skip(i) {
				continue
			}
			res := c.Process(ctx, &consumer.Message{ID: m.ID.String(), Payload: m.Payload})
			if !res.Settled() {
				f.Fail(i, fmt.Errorf("consumer: %v", res.Err))
				continue
			}
			mu.Lock()
			delivered = append(delivered, m)
			mu.Unlock()
		}
		return f.Err(ctx)
	})
	var out testenv.Logs
	for range 2 {
		r := newRelay(t, b, sink, relay.Config{
			Logger:  out.Logger(),
			Workers: 2, BatchSize: 50, ListenConnString: p.direct,
			PollInterval: time.Hour, LeaseTTL: time.Hour,
		})
		run(t, r)
		<-r.Ready()
	}

	// The listener wakes the workers once it listens, and a woken worker
	// polls every NotifyInterval for a while (outbox.Config): let that pass,
	// so that only a NOTIFY can wake them.
	time.Sleep(time.Second)
	const n, keys = 1000, 20
	for from := 0; from < n; from += 100 {
		enqueue(t, b, keyed("d", 100, keys, from)...)
	}
	var applied int
	idemqtest.WaitFor(t, "every message applied", func() bool {
		if err := p.directPool.QueryRow(ctx, `SELECT count(*) FROM applied`).Scan(&applied); err != nil {
			t.Fatal(err)
		}
		return applied >= n
	})
	var distinctIDs int
	if err := p.directPool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM applied`).Scan(&distinctIDs); err != nil {
		t.Fatal(err)
	}
	if applied != n || distinctIDs != n {
		t.Fatalf("applied %d rows, %d distinct messages; want %d once each", applied, distinctIDs, n)
	}
	mu.Lock()
	got := append([]relay.Message(nil), delivered...)
	mu.Unlock()
	checkOrder(t, got)
	if n := len(out.Records("relay: LISTEN receives no notifications")); n != 0 {
		t.Errorf("the relays warned %d times that LISTEN receives nothing; their listen connection is direct", n)
	}
	// The relays commit their last batches after the consumer applied them.
	idemqtest.WaitFor(t, "an empty outbox", func() bool { return pending(t, b) == 0 })
}

// TestPgBouncerFencing shows that a batch's transaction keeps its server
// connection through PgBouncer while the Sink publishes: relay A's batch is
// in flight, A's worker row is deleted (A looks dead), and relay B, which
// then tries to take every partition, takes none of them while A's batch
// holds their lease rows. Once A commits, the partitions change hands
// (token bumped), and every message is published once, in order per key.
func TestPgBouncerFencing(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	b := setupOn(t, p.pool(t, nil))
	ctx := b.ctx
	enqueue(t, b, keyed("d", 200, 10, 0)...)

	var mu sync.Mutex
	var published []relay.Message
	calls := map[string]int{}
	inFlight, release := make(chan struct{}), make(chan struct{})
	sink := func(name string) relay.Sink {
		return relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
			mu.Lock()
			published = append(published, batch...)
			calls[name]++
			first := name == "A" && calls[name] == 1
			mu.Unlock()
			if first {
				close(inFlight)
				<-release
			}
			return nil
		})
	}
	cfg := relay.Config{BatchSize: 20, ListenConnString: p.direct, LeaseTTL: 3 * time.Second}
	run(t, newRelay(t, b, sink("A"), cfg))
	<-inFlight

	relays := pgx.Identifier{"public", "idemq_outbox_relays"}.Sanitize()
	lease := pgx.Identifier{"public", "idemq_outbox_lease"}.Sanitize()
	var owner string
	if err := p.directPool.QueryRow(ctx, `DELETE FROM `+relays+` RETURNING owner::text`).Scan(&owner); err != nil {
		t.Fatalf("delete A's worker row: %v", err)
	}
	var takes atomic.Int64
	poolB := p.pool(t, func(sql string) {
		if strings.Contains(sql, "token = t.token + 1") {
			takes.Add(1)
		}
	})
	bB := bundle{ctx: ctx, pool: poolB, ob: mustOutbox(t, poolB)}
	run(t, newRelay(t, bB, sink("B"), cfg))
	idemqtest.WaitFor(t, "B's attempt to take partitions", func() bool { return takes.Load() > 0 })
	var others int
	if err := p.directPool.QueryRow(ctx, `SELECT count(*) FROM `+lease+` WHERE owner IS DISTINCT FROM $1::uuid`, owner).Scan(&others); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	bCalls := calls["B"]
	mu.Unlock()
	if others != 0 || bCalls != 0 {
		t.Fatalf("while A's batch was in flight, %d partitions left A and B published %d batches", others, bCalls)
	}
	close(release)

	idemqtest.WaitFor(t, "every message published", func() bool { return pending(t, b) == 0 })
	idemqtest.WaitFor(t, "B owning partitions", func() bool {
		var n int
		if err := p.directPool.QueryRow(ctx, `SELECT count(*) FROM `+lease+` WHERE owner IS DISTINCT FROM $1::uuid AND owner IS NOT NULL`, owner).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if dups := checkOrder(t, published); dups != 0 || len(published) != 200 {
		t.Fatalf("published %d messages with %d duplicates, want 200 once each", len(published), dups)
	}
}

func mustOutbox(t *testing.T, pool *pgxpool.Pool) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// Without a direct connection for LISTEN, a relay behind PgBouncer listens
// through the pooler, where notifications never arrive: it says so in a
// warning naming the fix, and still publishes, by polling.
func TestPgBouncerListenThroughPoolerWarns(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	b := setupOn(t, p.pool(t, nil))
	var out testenv.Logs
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{Logger: out.Logger(), PollInterval: 50 * time.Millisecond}))
	idemqtest.WaitFor(t, "the warning", func() bool { return len(out.Records("relay: LISTEN receives no notifications")) == 1 })
	enqueue(t, b, keyed("d", 10, 2, 0)...)
	idemqtest.WaitFor(t, "publishing by polling", func() bool { return len(rec.deliveries()) == 10 })
}
