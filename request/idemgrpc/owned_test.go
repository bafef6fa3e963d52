package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	recovery "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	grpcgo "google.golang.org/grpc"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// TestOwnTransaction: in the transaction-owning mode the charge and the
// record commit in the interceptor's transaction: retries replay it; a
// released outcome (UNAVAILABLE) and a panic leave no charge and no record,
// and the retry's charge is the only one.
func TestOwnTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testenv.Postgres(t)
	st, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (id bigserial PRIMARY KEY, account text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	gate := requesttest.NewGate(t)
	started := make(chan struct{}, 1)
	charge := func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
		run := runs.Add(1)
		tx, ok := pgstore.Tx(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no transaction")
		}
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO charges (account) VALUES ($1) RETURNING id`, req.Account).Scan(&id); err != nil {
			return nil, err
		}
		switch {
		case req.Account == "slow":
			started <- struct{}{}
			gate.Wait()
		case req.Account == "flaky" && run == 1:
			return nil, status.Error(codes.Unavailable, "busy")
		case req.Account == "buggy" && run == 1:
			panic("handler bug")
		}
		return &testpb.ChargeResponse{ChargeId: fmt.Sprintf("%s-%d", req.Account, id), Amount: req.Amount}, nil
	}
	c := dial(t, serve(t, &ledger{charge: charge}, grpcgo.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(),
		serverInterceptor(t, st, request.Config{}, ServerConfig{OwnTransaction: true}))))
	charges := func(account string) (n int) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE account = $1`, account).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, account := range []string{"steady", "flaky", "buggy"} {
		runs.Store(0)
		req := &testpb.ChargeRequest{Account: account, Amount: 5}
		if account != "steady" {
			if _, _, err := call(ctx, c, account, req); err == nil {
				t.Fatalf("%s: the failing first call succeeded", account)
			}
			if n := charges(account); n != 0 {
				t.Fatalf("%s: %d charges after the failed call, want none", account, n)
			}
			if _, err := st.Get(ctx, request.ID{Key: account}); !errors.Is(err, request.ErrNotFound) {
				t.Fatalf("%s: record after the failed call: %v, want none", account, err)
			}
		}
		first, replayed, err := call(ctx, c, account, req)
		if err != nil || replayed {
			t.Fatalf("%s: %v, replayed %v, %v", account, first, replayed, err)
		}
		again, replayed, err := call(ctx, c, account, req)
		if err != nil || !replayed || !proto.Equal(again, first) {
			t.Fatalf("%s: retry %v, replayed %v, %v; want %v replayed", account, again, replayed, err, first)
		}
		if n := charges(account); n != 1 {
			t.Fatalf("%s: %d charges, want 1", account, n)
		}
	}
	// A duplicate of a call whose transaction is still running waits up
	// to Guard.Wait (the minimum here), then is ABORTED with a pushback.
	slow := &testpb.ChargeRequest{Account: "slow", Amount: 5}
	done := make(chan error, 1)
	go func() { _, _, err := call(ctx, c, "slow", slow); done <- err }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the first slow call ended before its handler ran: %v", err)
	case <-time.After(requesttest.WaitTimeout):
		t.Fatal("gave up waiting for the slow call's handler")
	}
	var trailer metadata.MD
	_, err = c.Charge(withKey(ctx, "slow"), slow, grpcgo.Trailer(&trailer))
	if pushback := trailer.Get(PushbackTrailer); status.Code(err) != codes.Aborted || reason(err) != ReasonInFlight || len(pushback) == 0 || pushback[0] == "0" {
		t.Fatalf("duplicate of a running call: %v (reason %q), pushback %v; want ABORTED in flight with a pushback", err, reason(err), pushback)
	}
	gate.Open()
	if err := requesttest.Recv(t, done, "the slow call"); err != nil {
		t.Fatal(err)
	}
	rdb, prefix := testenv.Redis(t)
	if _, err := UnaryServerInterceptor(requesttest.Redis(t, rdb, prefix), ServerConfig{Methods: chargeMethods, OwnTransaction: true}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("OwnTransaction on Redis: %v, want ErrConfig", err)
	}
}
