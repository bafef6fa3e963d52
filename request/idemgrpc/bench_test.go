package idemgrpc

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/requesttest"
	grpcgo "google.golang.org/grpc"
)

// BenchmarkServerInterceptor measures what the interceptor adds to a call
// of a trivial handler over loopback, with each store, against the same
// server without it. The setups take turns call by call, so that every
// ratio compares calls made under the same load of the machine. Each call
// has a fresh key: one claim and one complete in the store.
func BenchmarkServerInterceptor(b *testing.B) {
	echo := &ledger{charge: func(_ context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
		return &testpb.ChargeResponse{ChargeId: "ch", Amount: req.Amount}, nil
	}}
	type setup struct {
		name   string
		client testpb.LedgerClient
		total  time.Duration
	}
	setups := []*setup{{name: "none", client: dial(b, serve(b, echo))}}
	for _, kind := range requesttest.Kinds {
		ic := serverInterceptor(b, kind.Open(b), request.Config{}, ServerConfig{})
		setups = append(setups, &setup{name: kind.Name, client: dial(b, serve(b, echo, grpcgo.UnaryInterceptor(ic)))})
	}
	ctx := context.Background()
	req := &testpb.ChargeRequest{Account: "a", Amount: 1}
	for _, s := range setups { // connect and warm up
		if _, err := s.client.Charge(withKey(ctx, "warm-up"), req); err != nil {
			b.Fatal(err)
		}
	}

	calls := 0
	for b.Loop() {
		calls++
		key := "bench-" + strconv.Itoa(calls)
		for _, s := range setups {
			start := time.Now()
			if _, err := s.client.Charge(withKey(ctx, key), req); err != nil {
				b.Fatal(err)
			}
			s.total += time.Since(start)
		}
	}
	none := setups[0].total
	for _, s := range setups {
		b.ReportMetric(s.total.Seconds()*1e6/float64(calls), s.name+"-µs/call")
		if s != setups[0] {
			b.ReportMetric(float64(s.total)/float64(none), s.name+"/none")
		}
	}
}
