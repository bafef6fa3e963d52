package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request/idemgrpc"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
)

// charges numbers the charges it makes.
type charges struct {
	testpb.UnimplementedLedgerServer
	n atomic.Int64
}

func (c *charges) Charge(_ context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
	return &testpb.ChargeResponse{ChargeId: fmt.Sprintf("charge-%d", c.n.Add(1)), Amount: req.Amount}, nil
}

// A retry with the same key gets the first response, marked as a replay;
// the same key with another request is refused.
func ExampleUnaryServerInterceptor() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "idemq_example")
	if err != nil {
		log.Fatal(err)
	}
	defer done()
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	idempotent, err := idemgrpc.UnaryServerInterceptor(store, idemgrpc.ServerConfig{
		Methods: []string{testpb.Ledger_Charge_FullMethodName},
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idempotent))
	testpb.RegisterLedgerServer(srv, &charges{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	client := testpb.NewLedgerClient(cc)

	ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "order-1")
	for range 2 {
		var trailer metadata.MD
		resp, err := client.Charge(ctx, &testpb.ChargeRequest{Account: "alice", Amount: 250}, grpc.Trailer(&trailer))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.ChargeId, "replayed:", trailer.Get(idemgrpc.ReplayedTrailer))
	}
	_, err = client.Charge(ctx, &testpb.ChargeRequest{Account: "alice", Amount: 300})
	fmt.Println(status.Code(err))
	// Output:
	// charge-1 replayed: []
	// charge-1 replayed: [true]
	// FailedPrecondition
}

// The key interceptor comes before go-grpc-middleware's retry interceptor,
// so that all attempts of a call carry one key; one budget bounds the
// retries of both.
func ExampleUnaryClientInterceptor() {
	budget, err := idemgrpc.NewRetryBudget(idemgrpc.BudgetConfig{})
	if err != nil {
		log.Fatal(err)
	}
	keys, err := idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{
		Retry:  idemq.Retry{MaxAttempts: 1}, // the middleware retries
		Budget: budget,
	})
	if err != nil {
		log.Fatal(err)
	}
	cc, err := grpc.NewClient("orders.shop.svc.cluster.local:8080",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			keys,
			retry.UnaryClientInterceptor(
				retry.WithMax(3),
				retry.WithBackoff(retry.BackoffExponentialWithJitter(50*time.Millisecond, 0.5)),
				retry.WithRetriable(budget.Retriable(codes.Unavailable, codes.Aborted)),
			),
		))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	_ = testpb.NewLedgerClient(cc)
}

// Retries may add RetryRatio of the recent calls plus a floor of
// MinRetriesPerSecond over the window.
func ExampleRetryBudget() {
	budget, err := idemgrpc.NewRetryBudget(idemgrpc.BudgetConfig{
		RetryRatio: 0.1, MinRetriesPerSecond: 0.1, Window: 10 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	for range 100 {
		budget.Deposit()
	}
	retries := 0
	for budget.Withdraw() {
		retries++
	}
	fmt.Println(retries, "retries for 100 calls")
	// Output: 11 retries for 100 calls
}
