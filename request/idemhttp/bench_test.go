package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkMiddleware serves a trivial handler over loopback without the
// middleware and with it, one sub-benchmark per store, every request with
// a new key (a claim and a complete each). Throughput is measured with 32
// concurrent keep-alive clients; latency with one client sending requests
// one after another, so that it shows what the middleware adds rather
// than queueing at saturation. Within a sub-benchmark the variants
// alternate in rounds, so that load on the shared machine hits all alike.
// Each reports its variants' requests/s and latency p50/p99, the latency
// a store adds at p50 and p99, and its throughput ratio to no middleware.
//
// redis also runs the store without its autopipeliner (redis-plain) and
// reports the Redis commands and round trips per request. postgres-record
// is the path that matters for Postgres: the handler runs a business
// transaction (one INSERT) and commits the request record in it with
// idemhttp.Record and pgstore's CompleteTx, against the same transaction
// without the middleware; postgres-tx runs that transaction in the
// middleware's own (Config.OwnTransaction). Every variant reports its
// throughput ratio with 32 clients (-ratio) and with one (-ratio-1client).
func BenchmarkMiddleware(b *testing.B) {
	handler := nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(nethttp.StatusCreated)
		_, _ = io.WriteString(w, `{"order":42,"status":"created"}`)
	})
	wrapWith := func(b *testing.B, s request.Store, cfg idemhttp.Config, h nethttp.Handler) *httptest.Server {
		m, err := idemhttp.New(s, cfg)
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(m.Wrap(h))
		b.Cleanup(srv.Close)
		return srv
	}
	wrap := func(b *testing.B, s request.Store, h nethttp.Handler) *httptest.Server {
		return wrapWith(b, s, idemhttp.Config{}, h)
	}
	plain := func(b *testing.B, h nethttp.Handler) *httptest.Server {
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		return srv
	}
	b.Run("postgres", func(b *testing.B) {
		compare(b, []variant{{"none", plain(b, handler)}, {"postgres", wrap(b, benchPG(b, benchClients), handler)}}, nil)
	})
	b.Run("postgres-record", func(b *testing.B) {
		pool, s := benchOrders(b)
		orders := txHandler(pool, s)
		compare(b, []variant{{"none", plain(b, orders)}, {"postgres-record", wrap(b, s, orders)}}, nil)
	})
	b.Run("postgres-tx", func(b *testing.B) {
		pool, s := benchOrders(b)
		orders := ownedHandler(pool)
		compare(b, []variant{{"none", plain(b, orders)}, {"postgres-tx", wrapWith(b, s, idemhttp.Config{OwnTransaction: true}, orders)}}, nil)
	})
	b.Run("redis", func(b *testing.B) {
		var counted redisCounter
		auto, rdb := benchRedis(b, benchClients, redisstore.Config{}, &counted)
		plainStore, _ := benchRedis(b, benchClients, redisstore.Config{NoAutoPipeline: true}, nil)
		vs := []variant{{"none", plain(b, handler)}, {"redis", wrap(b, auto, handler)}, {"redis-plain", wrap(b, plainStore, handler)}}
		compare(b, vs, func(v int, requests int) {
			if vs[v].name == "redis" {
				counted.requests.Add(int64(requests))
			}
		})
		_ = rdb
		n := float64(counted.requests.Load())
		b.ReportMetric(float64(counted.commands.Load())/n, "redis-commands/req")
		b.ReportMetric(float64(counted.trips.Load())/n, "redis-roundtrips/req")
	})
	b.Run("dynamodb", func(b *testing.B) {
		db, table := testenv.DynamoDB(b)
		// dynalite on a loaded machine answers 32 clients slowly: a patient
		// store timeout keeps its slowness a figure rather than 503s.
		patient := idemhttp.Config{Guard: request.Config{StoreTimeout: 30 * time.Second}}
		compare(b, []variant{{"none", plain(b, handler)}, {"dynamodb", wrapWith(b, requesttest.Dynamo(b, db, table), patient, handler)}}, nil)
	})
}

const benchClients = 32

type variant struct {
	name string
	srv  *httptest.Server
}

// compare loads the variants in alternating rounds, the first being the
// baseline, and reports their figures; loaded, if not nil, is told how
// many requests each throughput load sent.
func compare(b *testing.B, variants []variant, loaded func(v, requests int)) {
	client := &nethttp.Client{Transport: &nethttp.Transport{MaxIdleConnsPerHost: benchClients, MaxConnsPerHost: benchClients}}
	b.Cleanup(client.CloseIdleConnections)

	const rounds = 10
	n := max(b.N, 2000)
	per := max(n/rounds, benchClients)
	spent, spent1 := make([]time.Duration, len(variants)), make([]time.Duration, len(variants))
	latencies := make([][]time.Duration, len(variants))
	b.ResetTimer()
	for range rounds {
		for v, vr := range variants {
			d, _ := load(b, client, vr.srv.URL, per, benchClients)
			spent[v] += d
			d1, lat := load(b, client, vr.srv.URL, per/4, 1)
			spent1[v] += d1
			latencies[v] = append(latencies[v], lat...)
			if loaded != nil {
				loaded(v, per+per/4)
			}
		}
	}
	b.StopTimer()
	rates := make([]float64, len(variants))
	p50s, p99s := make([]time.Duration, len(variants)), make([]time.Duration, len(variants))
	for v, vr := range variants {
		rates[v] = float64(per*rounds) / spent[v].Seconds()
		slices.Sort(latencies[v])
		p50s[v], p99s[v] = percentile(latencies[v], 0.50), percentile(latencies[v], 0.99)
		b.ReportMetric(rates[v], vr.name+"-req/s")
		b.ReportMetric(ms(p50s[v]), vr.name+"-p50-ms")
		b.ReportMetric(ms(p99s[v]), vr.name+"-p99-ms")
		if v > 0 {
			b.ReportMetric(ms(p50s[v]-p50s[0]), vr.name+"-added-p50-ms")
			b.ReportMetric(ms(p99s[v]-p99s[0]), vr.name+"-added-p99-ms")
			b.ReportMetric(rates[v]/rates[0], vr.name+"-ratio")
			b.ReportMetric(spent1[0].Seconds()/spent1[v].Seconds(), vr.name+"-ratio-1client")
		}
	}
}

// benchOrders returns a pool, a migrated store on it and the table
// bench_orders, for the handlers with a business transaction.
func benchOrders(b *testing.B) (*pgxpool.Pool, *pgstore.Store) {
	pool := benchPool(b, benchClients)
	s, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, sku text NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool, s
}

// ownedHandler runs the same business transaction as txHandler: in the
// middleware's transaction when it owns one (the transaction-owning
// mode), otherwise in its own.
func ownedHandler(pool *pgxpool.Pool) nethttp.Handler {
	order := func(w nethttp.ResponseWriter, r *nethttp.Request, tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO bench_orders (sku) VALUES ('a') RETURNING id`).Scan(&id); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(nethttp.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"order":%d,"status":"created"}`, id)
		return nil
	}
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		var err error
		if tx, ok := pgstore.Tx(r.Context()); ok {
			err = order(w, r, tx)
		} else {
			err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return order(w, r, tx) })
		}
		if err != nil {
			nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
		}
	})
}

// txHandler runs the handler's business transaction: one INSERT, and,
// behind the middleware, the request record completed in it.
func txHandler(pool *pgxpool.Pool, s *pgstore.Store) nethttp.Handler {
	return nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		ctx := r.Context()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO bench_orders (sku) VALUES ('a') RETURNING id`).Scan(&id); err != nil {
				return err
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(nethttp.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"order":%d,"status":"created"}`, id)
			err := idemhttp.Record(r, func(l idemq.Lease, resp request.Response) error {
				return s.CompleteTx(ctx, tx, l, resp)
			})
			if errors.Is(err, idemhttp.ErrNotProtected) {
				return nil
			}
			return err
		})
		if err != nil {
			nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
		}
	})
}

// redisCounter counts the commands and round trips a client sends, and
// the requests they served.
type redisCounter struct {
	commands, trips, requests atomic.Int64
}

func (c *redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.commands.Add(1)
		c.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (c *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.commands.Add(int64(len(cmds)))
		c.trips.Add(1)
		return next(ctx, cmds)
	}
}

// load sends n POSTs with new keys from workers clients and returns the
// wall time and each request's latency.
func load(b *testing.B, client *nethttp.Client, url string, n, workers int) (time.Duration, []time.Duration) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				req, _ := nethttp.NewRequest(nethttp.MethodPost, url+"/orders", strings.NewReader(`{"sku":"a","qty":1}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(idemhttp.HeaderKey, `"`+uuid.NewString()+`"`)
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				lat[i] = time.Since(t0)
				if resp.StatusCode != nethttp.StatusCreated {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), lat
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(float64(len(sorted))*p), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func benchPool(b *testing.B, conns int) *pgxpool.Pool {
	u, err := url.Parse(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(conns))
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

func benchPG(b *testing.B, conns int) request.Store {
	s, err := pgstore.New(benchPool(b, conns), pgstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

// benchRedis returns a store on a client of its own with conns
// connections, counted by hook if not nil.
func benchRedis(b *testing.B, conns int, cfg redisstore.Config, hook redis.Hook) (request.Store, *redis.Client) {
	shared, prefix := testenv.Redis(b)
	opts := *shared.Options()
	opts.PoolSize = conns
	rdb := redis.NewClient(&opts)
	b.Cleanup(func() { _ = rdb.Close() })
	if hook != nil {
		rdb.AddHook(hook)
	}
	cfg.Prefix = prefix
	s, err := redisstore.New(context.Background(), rdb, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return s, rdb
}
