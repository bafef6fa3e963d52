package peers_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// peer is one transactional outbox: a way to publish inside the business
// transaction and a forwarder that drains the outbox into a Sink that does
// nothing but count.
type peer interface {
	// publishTx commits one business transaction: an order row and one
	// message to the outbox.
	publishTx(ctx context.Context, i int) error
	// fill writes n messages, keys round robin over keys (0: unkeyed), in
	// large transactions.
	fill(ctx context.Context, n, keys int) error
	// start runs the forwarder, calling delivered with the number of
	// messages of each call of its Sink, until stop is called.
	start(ctx context.Context, delivered func(n int)) (stop func(), err error)
}

var payload = []byte(`{"order":42,"amount":"10.00","currency":"EUR","customer":"c-0000000001"}`)

// setup returns the peers on one fresh database, with a pool large enough
// for the concurrent writers.
func setup(b *testing.B) (idemqPeer, adapterPeer, watermillPeer peer) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = writers + 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	for _, table := range []string{"orders_idemq", "orders_adapter", "orders_watermill"} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (id bigint NOT NULL, placed_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			b.Fatal(err)
		}
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	b.Cleanup(func() { db.Close() })
	wm := &watermillOutbox{db: db}
	if err := wm.migrate(ctx); err != nil {
		b.Fatal(err)
	}
	return &idemqOutbox{pool: pool, ob: ob}, newAdapter(b, pool), wm
}

// writers is the number of concurrent business transactions in the
// publish benchmark.
const writers = 8

type idemqOutbox struct {
	pool *pgxpool.Pool
	ob   *outbox.Outbox
}

func (p *idemqOutbox) publishTx(ctx context.Context, i int) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders_idemq (id) VALUES ($1)`, i); err != nil {
			return err
		}
		return p.ob.EnqueueTx(ctx, tx, outbox.Message{Destination: "orders", Key: fmt.Sprint("customer-", i%1000), Payload: payload})
	})
}

func (p *idemqOutbox) fill(ctx context.Context, n, keys int) error {
	for from := 0; from < n; from += 10_000 {
		msgs := make([]outbox.Message, min(10_000, n-from))
		for i := range msgs {
			msgs[i] = outbox.Message{Destination: "orders", Payload: payload}
			if keys > 0 {
				msgs[i].Key = fmt.Sprint("customer-", (from+i)%keys)
			}
		}
		if err := p.ob.Enqueue(ctx, msgs...); err != nil {
			return err
		}
	}
	return nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func (p *idemqOutbox) start(ctx context.Context, delivered func(int)) (func(), error) {
	sink := relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
		delivered(len(batch))
		return nil
	})
	r, err := relay.New(p.pool, p.ob, sink, relay.Config{Logger: quiet})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(ctx) })
	return func() { cancel(); wg.Wait() }, nil
}

// watermillOutbox is Watermill's SQL outbox as its documentation sets it
// up: a watermill-sql Publisher on the business transaction wrapped by the
// forwarder's Publisher (which puts each message in an envelope for the
// forwarder topic), and a Forwarder reading that topic with a watermill-sql
// Subscriber and publishing to the real publisher, here one that counts.
type watermillOutbox struct {
	db *sql.DB
}

// forwarderTopic is the SQL topic (table) the forwarder reads.
const forwarderTopic = "outbox"

var (
	schema  = wmsql.DefaultPostgreSQLSchema{}
	offsets = wmsql.DefaultPostgreSQLOffsetsAdapter{}
	logger  = watermill.NopLogger{}
)

// WatermillPollInterval is the Subscriber's PollInterval: how long it
// waits after a query that found nothing (Watermill's default is 1 s).
const watermillPollInterval = 100 * time.Millisecond

func (p *watermillOutbox) migrate(ctx context.Context) error {
	for _, q := range append(schema.SchemaInitializingQueries(forwarderTopic), offsets.SchemaInitializingQueries(forwarderTopic)...) {
		if _, err := p.db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return err
		}
	}
	return nil
}

// publishIn publishes msgs to the "orders" topic through the forwarder
// inside tx.
func publishIn(tx *sql.Tx, msgs ...*message.Message) error {
	pub, err := wmsql.NewPublisher(tx, wmsql.PublisherConfig{SchemaAdapter: schema}, logger)
	if err != nil {
		return err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}).Publish("orders", msgs...)
}

func (p *watermillOutbox) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func (p *watermillOutbox) publishTx(ctx context.Context, i int) error {
	return p.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders_watermill (id) VALUES ($1)`, i); err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set("key", fmt.Sprint("customer-", i%1000))
		return publishIn(tx, msg)
	})
}

// fill writes 1,000 messages per INSERT (Postgres allows 65,535 parameters
// per statement, Watermill uses 3 per message), 10 per transaction.
func (p *watermillOutbox) fill(ctx context.Context, n, keys int) error {
	for from := 0; from < n; from += 10_000 {
		err := p.inTx(ctx, func(tx *sql.Tx) error {
			for chunk := from; chunk < min(from+10_000, n); chunk += 1000 {
				msgs := make([]*message.Message, min(1000, n-chunk))
				for i := range msgs {
					msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
					if keys > 0 {
						msgs[i].Metadata.Set("key", fmt.Sprint("customer-", (chunk+i)%keys))
					}
				}
				if err := publishIn(tx, msgs...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// counting is the forwarder's destination publisher: it only counts.
type counting func(n int)

func (c counting) Publish(_ string, msgs ...*message.Message) error {
	c(len(msgs))
	return nil
}

func (counting) Close() error { return nil }

func (p *watermillOutbox) start(ctx context.Context, delivered func(int)) (func(), error) {
	sub, err := wmsql.NewSubscriber(p.db, wmsql.SubscriberConfig{
		SchemaAdapter:  schema,
		OffsetsAdapter: offsets,
		PollInterval:   watermillPollInterval,
	}, logger)
	if err != nil {
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(sub, counting(delivered), logger, forwarder.Config{ForwarderTopic: forwarderTopic})
	if err != nil {
		return nil, err
	}
	errs := make(chan error, 1)
	go func() { errs <- fwd.Run(ctx) }()
	select {
	case <-fwd.Running():
	case err := <-errs:
		return nil, err
	}
	return func() {
		_ = fwd.Close()
		<-errs
	}, nil
}

// medians runs measure on each peer rounds times, alternating, and
// returns the median of each, in the order of peers.
func medians(rounds int, measure func(peer) float64, peers ...peer) []float64 {
	got := make([][]float64, len(peers))
	for range rounds {
		for i, p := range peers {
			got[i] = append(got[i], measure(p))
		}
	}
	out := make([]float64, len(peers))
	for i := range got {
		out[i] = median(got[i])
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// report reports both figures under unit and idemq's over Watermill's as
// the ratio.
func report(b *testing.B, unit string, idemq, watermill float64) {
	b.ReportMetric(idemq, "idemq_"+unit)
	b.ReportMetric(watermill, "watermill_"+unit)
	b.ReportMetric(idemq/watermill, "ratio")
	b.ReportMetric(0, "ns/op")
}

// reportAdapter reports the figure of idemq's Watermill adapter under unit
// and the adapter's over Watermill SQL's as adapter_ratio.
func reportAdapter(b *testing.B, unit string, adapter, watermill float64) {
	b.ReportMetric(adapter, "adapter_"+unit)
	b.ReportMetric(adapter/watermill, "adapter_ratio")
}

// BenchmarkPublish commits business transactions (an order row and one
// message) from 8 concurrent writers for 2 s per round; ratio = idemq
// tx/s / Watermill tx/s, adapter_ratio = idemq's Watermill adapter tx/s /
// Watermill tx/s.
func BenchmarkPublish(b *testing.B) {
	idemq, adapter, watermill := setup(b)
	ctx := context.Background()
	for range b.N {
		m := medians(3, func(p peer) float64 {
			var n atomic.Int64
			deadline := time.Now().Add(2 * time.Second)
			var wg sync.WaitGroup
			for w := range writers {
				wg.Go(func() {
					for i := w; time.Now().Before(deadline); i += writers {
						if err := p.publishTx(ctx, i); err != nil {
							b.Error(err)
							return
						}
						n.Add(1)
					}
				})
			}
			wg.Wait()
			return float64(n.Load()) / 2
		}, idemq, adapter, watermill)
		report(b, "tx/s", m[0], m[2])
		reportAdapter(b, "tx/s", m[1], m[2])
	}
}

// stallTimeout bounds a wait for the forwarder: Watermill's subscriber
// reads nothing committed after the oldest transaction still open on the
// server began, in any database, so on a shared server it can stall for as
// long as someone else's transaction stays open.
const stallTimeout = time.Minute

// drainRate fills n messages, then runs the peer's forwarder until all of
// them reached its Sink (or stallTimeout passed) and returns messages per
// second.
func drainRate(b *testing.B, p peer, n, keys int) float64 {
	ctx := context.Background()
	if err := p.fill(ctx, n, keys); err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	done := make(chan struct{})
	start := time.Now()
	stop, err := p.start(ctx, func(k int) {
		if got.Add(int64(k)) == int64(n) {
			close(done)
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(stallTimeout):
		b.Logf("%T stalled: %d of %d messages forwarded in %v", p, got.Load(), n, stallTimeout)
	}
	elapsed := time.Since(start)
	stop()
	return float64(min(got.Load(), int64(n))) / elapsed.Seconds()
}

// BenchmarkDrain fills 20,000 messages into each outbox and measures how
// fast its forwarder empties it into a Sink that does nothing, keyed (1,000
// keys) and unkeyed. Watermill's SQL subscriber has no keys: it forwards
// one topic in order either way. ratio = idemq msgs/s / Watermill msgs/s;
// adapter_ratio = idemq's Watermill adapter msgs/s (Watermill messages
// acked one by one from a Subscriber's channel) / Watermill msgs/s.
func BenchmarkDrain(b *testing.B) {
	const n = 20_000
	for _, keys := range []int{1000, 0} {
		name := fmt.Sprint("keys=", keys)
		if keys == 0 {
			name = "unkeyed"
		}
		b.Run(name, func(b *testing.B) {
			idemq, adapter, watermill := setup(b)
			for range b.N {
				m := medians(3, func(p peer) float64 { return drainRate(b, p, n, keys) }, idemq, adapter, watermill)
				report(b, "msgs/s", m[0], m[2])
				reportAdapter(b, "msgs/s", m[1], m[2])
			}
		})
	}
}

// BenchmarkLatency measures, at low load (one business transaction every
// 20 ms), the time from its commit to the Sink call, p50 and p99 of 100
// each: idemq is woken by NOTIFY, Watermill's subscriber polls (every
// watermillPollInterval when idle). ratio = idemq p99 / Watermill p99.
func BenchmarkLatency(b *testing.B) {
	idemq, adapter, watermill := setup(b)
	ctx := context.Background()
	measure := func(p peer) (p50, p99 time.Duration) {
		calls := make(chan time.Time, 1)
		stop, err := p.start(ctx, func(int) {
			select {
			case calls <- time.Now():
			default: // a late delivery of a sample that timed out
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer stop()
		// One message first: the forwarder is up and has found its place.
		delivered := func(committed time.Time) time.Duration {
			select {
			case t := <-calls:
				return t.Sub(committed)
			case <-time.After(stallTimeout):
				b.Logf("%T stalled: no delivery within %v", p, stallTimeout)
				return stallTimeout
			}
		}
		if err := p.publishTx(ctx, -1); err != nil {
			b.Fatal(err)
		}
		delivered(time.Now())
		var lat []time.Duration
		for i := range 100 {
			select {
			case <-calls: // a late delivery of a sample that timed out
			default:
			}
			if err := p.publishTx(ctx, i); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, delivered(time.Now()))
			time.Sleep(20 * time.Millisecond)
		}
		slices.Sort(lat)
		return lat[len(lat)/2], lat[len(lat)*99/100]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for range b.N {
		var mine, adapted, theirs [2][]float64
		for range 2 {
			for _, r := range []struct {
				p   peer
				got *[2][]float64
			}{{idemq, &mine}, {adapter, &adapted}, {watermill, &theirs}} {
				p50, p99 := measure(r.p)
				r.got[0], r.got[1] = append(r.got[0], ms(p50)), append(r.got[1], ms(p99))
			}
		}
		b.ReportMetric(median(mine[0]), "idemq_p50_ms")
		b.ReportMetric(median(adapted[0]), "adapter_p50_ms")
		b.ReportMetric(median(theirs[0]), "watermill_p50_ms")
		report(b, "p99_ms", median(mine[1]), median(theirs[1]))
		reportAdapter(b, "p99_ms", median(adapted[1]), median(theirs[1]))
	}
}

// BenchmarkLongTransaction fills a keyed backlog (1,000 keys) that lasts
// each forwarder about 20 s, drains it for 4 s, then holds a transaction
// with an xid open elsewhere for 10 s while it keeps draining. It reports,
// for each peer, the rate during the transaction over the rate before it
// and the slowest second during it; ratio = idemq's during-rate /
// Watermill's.
func BenchmarkLongTransaction(b *testing.B) {
	idemq, _, watermill := setup(b)
	ctx := context.Background()
	// The backlog is sized from each peer's drain rate, measured first, to
	// last 20 s: one that ran out during the transaction would show as a
	// stall.
	backlog := map[peer]int{}
	for _, p := range []peer{idemq, watermill} {
		backlog[p] = min(int(drainRate(b, p, 20_000, 1000)*20), 5_000_000)
	}
	type result struct{ before, during, slowest float64 }
	measure := func(p peer) result {
		if err := p.fill(ctx, backlog[p], 1000); err != nil {
			b.Fatal(err)
		}
		var got atomic.Int64
		stop, err := p.start(ctx, func(n int) { got.Add(int64(n)) })
		if err != nil {
			b.Fatal(err)
		}
		defer stop()
		perSecond := func(seconds int) []float64 {
			rates := make([]float64, seconds)
			last := got.Load()
			for i := range rates {
				time.Sleep(time.Second)
				now := got.Load()
				rates[i], last = float64(now-last), now
			}
			return rates
		}
		before := perSecond(4)[1:] // the first second starts the forwarder
		tx, err := pgx.Connect(ctx, testenv.PostgresURL(b))
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Close(ctx)
		if _, err := tx.Exec(ctx, `BEGIN; SELECT pg_current_xact_id()`); err != nil {
			b.Fatal(err)
		}
		during := perSecond(10)
		if _, err := tx.Exec(ctx, `ROLLBACK`); err != nil {
			b.Fatal(err)
		}
		b.Logf("%T per second: before %.0f, during %.0f", p, before, during)
		return result{mean(before), mean(during), slices.Min(during)}
	}
	for range b.N {
		mine, theirs := measure(idemq), measure(watermill)
		b.ReportMetric(mine.during/mine.before, "idemq_during/before")
		b.ReportMetric(mine.slowest, "idemq_slowest_msgs/s")
		b.ReportMetric(theirs.during/theirs.before, "watermill_during/before")
		b.ReportMetric(theirs.slowest, "watermill_slowest_msgs/s")
		report(b, "during_msgs/s", mine.during, theirs.during)
	}
}

func mean(v []float64) float64 {
	var sum float64
	for _, x := range v {
		sum += x
	}
	return sum / float64(len(v))
}
