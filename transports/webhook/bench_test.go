package webhook_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// BenchmarkSinkThroughput posts batches of 500 webhooks of about 200 bytes
// to a local receiver through the Sink (signing, headers, classification,
// per-endpoint concurrency 8) and, as the baseline in the same run, the
// same bodies with a bare http.Client loop of 8 goroutines. It reports
// both rates and their ratio.
func BenchmarkSinkThroughput(b *testing.B) {
	bd := setup(b)
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
	}))
	b.Cleanup(srv.Close)
	const batch, conc = 500, 8
	ep, _ := addEndpoint(b, bd, srv.URL, func(e *endpoints.Endpoint) { e.Concurrency = conc })
	sink := fastSink(b, bd, webhook.Config{RefreshInterval: time.Hour})
	body := bytes.Repeat([]byte("x"), 200)
	msgs := make([]relay.Message, batch)
	for i := range msgs {
		msgs[i] = relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: endpoints.DestinationPrefix + ep.ID, Payload: body}}
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	bare := func() {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				for next.Add(1) <= batch {
					resp, err := client.Post(srv.URL, "application/json", bytes.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
	}
	ctx := context.Background()
	if err := sink.Publish(ctx, 0, msgs); err != nil { // warm up connections and the endpoint cache
		b.Fatal(err)
	}
	bare()
	var sinkTime, bareTime time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := sink.Publish(ctx, 0, msgs); err != nil {
			b.Fatal(err)
		}
		sinkTime += time.Since(start)
		start = time.Now()
		bare()
		bareTime += time.Since(start)
	}
	b.StopTimer()
	sinkRate := float64(b.N*batch) / sinkTime.Seconds()
	bareRate := float64(b.N*batch) / bareTime.Seconds()
	b.ReportMetric(sinkRate, "sink_msgs/s")
	b.ReportMetric(bareRate, "bare_msgs/s")
	b.ReportMetric(sinkRate/bareRate, "ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCommitToReceiver measures, at low load (one event at a time),
// the time from the commit of a PublishTx to the receiver's handler, with
// a relay woken by NOTIFY. It reports the median and the 99th percentile.
func BenchmarkCommitToReceiver(b *testing.B) {
	bd := setup(b)
	arrived := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived <- time.Now()
	}))
	b.Cleanup(srv.Close)
	addEndpoint(b, bd, srv.URL, nil)
	runRelay(b, bd, fastSink(b, bd, webhook.Config{RefreshInterval: time.Hour}), relay.Config{PollInterval: time.Second})
	publish(b, bd, event("warm-up", 0))
	<-arrived
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		publish(b, bd, event(fmt.Sprint("k", i%16), i))
		committed := time.Now()
		lat = append(lat, (<-arrived).Sub(committed))
	}
	b.StopTimer()
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(ms(0.5), "p50_ms")
	b.ReportMetric(ms(0.99), "p99_ms")
}
