package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	nethttp "net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// txOrders inserts an order and records the request in one transaction.
// The first run stalls before it records when stall is set.
type txOrders struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	runs  atomic.Int64
	stall *requesttest.Gate
	// fenced counts the runs whose Record was refused by the fence.
	fenced atomic.Int64
	// rollback makes the first run roll back after it recorded.
	rollback bool
}

var errRollback = errors.New("rolled back after Record")

func newTxOrders(t *testing.T) *txOrders {
	pool := testenv.Postgres(t)
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &txOrders{pool: pool, store: store}
}

func (o *txOrders) ServeHTTP(w nethttp.ResponseWriter, r *nethttp.Request) {
	run := o.runs.Add(1)
	// The handler's own writes must not be cut short by the request's
	// deadline: it commits or rolls back on its own terms.
	ctx := context.WithoutCancel(r.Context())
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (run) VALUES ($1) RETURNING id`, run).Scan(&id); err != nil {
			return err
		}
		if run == 1 && o.stall != nil {
			o.stall.Wait()
		}
		w.WriteHeader(nethttp.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"run":%d}`, id, run)
		err := idemhttp.Record(r, func(l idemq.Lease, resp request.Response) error {
			return o.store.CompleteTx(ctx, tx, l, resp)
		})
		if err == nil && run == 1 && o.rollback {
			return errRollback
		}
		return err
	})
	if errors.Is(err, idemq.ErrLeaseLost) {
		o.fenced.Add(1)
	}
	if err != nil {
		nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
	}
}

func (o *txOrders) count(t *testing.T) (n int) {
	if err := o.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRecordInHandlerTx: the order and the request record commit together;
// a retry replays the response and inserts nothing.
func TestRecordInHandlerTx(t *testing.T) {
	t.Parallel()
	o := newTxOrders(t)
	srv := serverWith(t, o.store, idemhttp.Config{}, o)
	key := quoted(uuid.NewString())
	first := post(t, srv.URL, key, "{}")
	if first.status != nethttp.StatusCreated || first.replayed() || first.header.Get(idemhttp.HeaderExpires) == "" {
		t.Fatalf("first: %+v", first)
	}
	for range 3 {
		if r := post(t, srv.URL, key, "{}"); r.body != first.body || !r.replayed() {
			t.Fatalf("retry: %+v, want %s replayed", r, first.body)
		}
	}
	if n, runs := o.count(t), o.runs.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d orders after %d runs, want 1 and 1", n, runs)
	}
}

// TestStalledTxIsRolledBack: a handler that stalls past its lease inside
// its transaction is taken over; its Record is refused by the fence, so its
// transaction rolls back, and exactly the successor's order exists.
func TestStalledTxIsRolledBack(t *testing.T) {
	t.Parallel()
	o := newTxOrders(t)
	o.stall = requesttest.NewGate(t)
	// Timeout bounds the claim too: generous, so a loaded store is not a 503.
	cfg := idemhttp.Config{Guard: request.Config{Lease: 300 * time.Millisecond}, Timeout: time.Second}
	srv := serverWith(t, o.store, cfg, o)
	key := quoted(uuid.NewString())
	firstReply := make(chan reply, 1)
	go func() { firstReply <- send(srv.URL, key, "{}") }()
	waitStarted(t, &o.runs, firstReply)
	second := retryUntilDone(t, srv.URL, key)
	if second.status != nethttp.StatusCreated || second.replayed() {
		t.Fatalf("takeover: %+v", second)
	}
	o.stall.Open()
	if first := recv(t, firstReply); first.body != second.body || !first.replayed() {
		t.Fatalf("stalled client got %+v, want the successor's %s replayed", first, second.body)
	}
	if n, fenced := o.count(t), o.fenced.Load(); n != 1 || fenced != 1 {
		t.Fatalf("%d orders, %d fenced runs; want 1 and 1", n, fenced)
	}
}

// TestRecordRolledBack: a response recorded in a transaction that then
// rolls back is not sent: the client gets a 500 and the key is handed back,
// so the retry runs the handler and its order is the only one.
func TestRecordRolledBack(t *testing.T) {
	t.Parallel()
	o := newTxOrders(t)
	o.rollback = true
	srv := serverWith(t, o.store, idemhttp.Config{}, o)
	key := quoted(uuid.NewString())
	first := post(t, srv.URL, key, "{}")
	if first.status != nethttp.StatusInternalServerError || problemType(t, first) != idemhttp.ProblemNotCommitted {
		t.Fatalf("first: %+v, want 500 %s", first, idemhttp.ProblemNotCommitted)
	}
	if n := o.count(t); n != 0 {
		t.Fatalf("%d orders after the rollback", n)
	}
	second := post(t, srv.URL, key, "{}")
	if second.status != nethttp.StatusCreated || second.replayed() {
		t.Fatalf("retry: %+v, want 201", second)
	}
	if r := post(t, srv.URL, key, "{}"); !r.replayed() || r.body != second.body {
		t.Fatalf("second retry: %+v, want the replay", r)
	}
	if n, runs := o.count(t), o.runs.Load(); n != 1 || runs != 2 {
		t.Fatalf("%d orders after %d runs, want 1 and 2", n, runs)
	}
}
