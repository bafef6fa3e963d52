package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemgrpc/internal/testpb"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
	"github.com/jackc/pgx/v5"
	grpcgo "google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A handler that records its outcome in its own transaction applies its
// writes exactly when the record lands: a rollback hands the key back.
func TestRecordInHandlerTransaction(t *testing.T) {
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
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	rollbacks := map[string]int{"flaky": 1} // account -> runs to roll back
	var mu sync.Mutex
	runs := map[string]int{}
	charge := func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.ChargeResponse, error) {
		mu.Lock()
		runs[req.Account]++
		run := runs[req.Account]
		mu.Unlock()
		var resp *testpb.ChargeResponse
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO charges (account, amount) VALUES ($1, $2) RETURNING id`,
				req.Account, req.Amount).Scan(&id); err != nil {
				return err
			}
			resp = &testpb.ChargeResponse{ChargeId: fmt.Sprintf("%s-%d", req.Account, id), Amount: req.Amount}
			if err := Record(ctx, resp, func(l idemq.Lease, r request.Response) error {
				return st.CompleteTx(ctx, tx, l, r)
			}); err != nil {
				return err
			}
			if run <= rollbacks[req.Account] {
				return status.Error(codes.Unavailable, "the commit failed") // rolls back
			}
			return nil
		})
		return resp, err
	}
	c := dial(t, serve(t, &ledger{charge: charge}, grpcgo.UnaryInterceptor(serverInterceptor(t, st, request.Config{}, ServerConfig{}))))

	for _, account := range []string{"steady", "flaky"} {
		req := &testpb.ChargeRequest{Account: account, Amount: 4}
		var answers []*testpb.ChargeResponse
		for range 3 {
			resp, _, err := call(ctx, c, account, req)
			if err == nil {
				answers = append(answers, resp)
			} else if status.Code(err) != codes.Unavailable {
				t.Fatal(err)
			}
		}
		var rows int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE account = $1`, account).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		ran := runs[account]
		mu.Unlock()
		if rows != 1 || len(answers) != 3-rollbacks[account] || !proto.Equal(answers[0], answers[len(answers)-1]) ||
			ran != 1+rollbacks[account] {
			t.Fatalf("%s: %d rows, %d runs, answers %v", account, rows, ran, answers)
		}
	}
	if err := Record(ctx, &testpb.ChargeResponse{}, nil); !errors.Is(err, ErrNotProtected) {
		t.Fatalf("Record outside a call: %v", err)
	}
}
