package idemhttp_test

import (
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
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// BenchmarkMiddleware serves a trivial handler over loopback without the
// middleware and with it on each store, every request with a new key (a
// claim and a complete each). Throughput is measured with 32 concurrent
// keep-alive clients; latency with one client sending requests one after
// another, so that it shows what the middleware adds rather than queueing
// at saturation. Variants alternate in rounds so that load on the shared
// machine hits all alike. It reports each variant's requests/s and latency
// p50/p99, the latency each store adds at p50 and p99, and its throughput
// ratio to no middleware.
func BenchmarkMiddleware(b *testing.B) {
	const clients = 32
	handler := nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(nethttp.StatusCreated)
		_, _ = io.WriteString(w, `{"order":42,"status":"created"}`)
	})
	type variant struct {
		name string
		srv  *httptest.Server
	}
	none := httptest.NewServer(handler)
	b.Cleanup(none.Close)
	variants := []variant{{"none", none}}
	for _, kind := range requesttest.Kinds {
		// As many connections as clients, so that the pools' default
		// sizes are not what is measured.
		var s request.Store
		switch kind.Name {
		case "postgres":
			s = benchPG(b, clients)
		case "redis":
			s = benchRedis(b, clients)
		default:
			s = kind.Open(b)
		}
		m, err := idemhttp.New(s, idemhttp.Config{})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(m.Wrap(handler))
		b.Cleanup(srv.Close)
		variants = append(variants, variant{kind.Name, srv})
	}
	client := &nethttp.Client{Transport: &nethttp.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	b.Cleanup(client.CloseIdleConnections)

	const rounds = 10
	n := max(b.N, 2000)
	per := max(n/rounds, clients)
	spent := make([]time.Duration, len(variants))
	latencies := make([][]time.Duration, len(variants))
	b.ResetTimer()
	for range rounds {
		for v, vr := range variants {
			d, _ := load(b, client, vr.srv.URL, per, clients)
			spent[v] += d
			_, lat := load(b, client, vr.srv.URL, per/4, 1)
			latencies[v] = append(latencies[v], lat...)
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
		}
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

func benchPG(b *testing.B, conns int) request.Store {
	u, err := url.Parse(testenv.PostgresURL(b))
	if err != nil {
		b.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(conns))
	u.RawQuery = q.Encode()
	return requesttest.Postgres(b, u.String())
}

func benchRedis(b *testing.B, conns int) request.Store {
	shared, prefix := testenv.Redis(b)
	opts := *shared.Options()
	opts.PoolSize = conns
	rdb := redis.NewClient(&opts)
	b.Cleanup(func() { _ = rdb.Close() })
	return requesttest.Redis(b, rdb, prefix)
}
