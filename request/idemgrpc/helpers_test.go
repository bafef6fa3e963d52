package idemgrpc

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// serve runs srv on a real gRPC server on loopback until the test ends and
// returns its address.
func serve(tb testing.TB, srv testpb.LedgerServer, opts ...grpcgo.ServerOption) string {
	tb.Helper()
	s := grpcgo.NewServer(opts...)
	testpb.RegisterLedgerServer(s, srv)
	return listen(tb, s)
}

// listen serves s on a loopback port until the test ends.
func listen(tb testing.TB, s *grpcgo.Server) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	tb.Cleanup(func() { s.Stop(); <-done })
	return lis.Addr().String()
}

// dial returns a Ledger client on addr, closed when the test ends.
func dial(tb testing.TB, addr string, opts ...grpcgo.DialOption) testpb.LedgerClient {
	tb.Helper()
	opts = append([]grpcgo.DialOption{grpcgo.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	cc, err := grpcgo.NewClient(addr, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	return testpb.NewLedgerClient(cc)
}

// ledger is a Ledger server whose Charge and Transfer are the test's funcs.
type ledger struct {
	testpb.UnimplementedLedgerServer
	charge   func(context.Context, *testpb.ChargeRequest) (*testpb.ChargeResponse, error)
	transfer func(context.Context, *testpb.TransferRequest) (*testpb.TransferResponse, error)
}

func (l *ledger) Charge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
	return l.charge(ctx, req)
}

func (l *ledger) Transfer(ctx context.Context, req *testpb.TransferRequest) (*testpb.TransferResponse, error) {
	return l.transfer(ctx, req)
}

// attempts records the metadata of every call a server received.
type attempts struct {
	mu  sync.Mutex
	mds []metadata.MD
}

func (a *attempts) record(ctx context.Context) int {
	md, _ := metadata.FromIncomingContext(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mds = append(a.mds, md)
	return len(a.mds)
}

// values returns name's first value in each recorded call ("" if absent).
func (a *attempts) values(name string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var vs []string
	for _, md := range a.mds {
		v := md.Get(name)
		if len(v) == 0 {
			v = []string{""}
		}
		vs = append(vs, v[0])
	}
	return vs
}

// interceptor records every call that reaches the server, before the
// interceptors after it decide anything.
func (a *attempts) interceptor(ctx context.Context, req any, _ *grpcgo.UnaryServerInfo, handler grpcgo.UnaryHandler) (any, error) {
	a.record(ctx)
	return handler(ctx, req)
}

func (a *attempts) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.mds)
}
