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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

// ownedOrders inserts an order in the request's transaction (the
// transaction-owning mode) and answers with what the request asks for.
type ownedOrders struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	runs  atomic.Int64
	gate  *requesttest.Gate // the first run waits on it, if set
	// fail is how the first run fails: "500", "panic" or "swallow" (a
	// failed statement whose error the handler ignores).
	fail string
}

func newOwnedOrders(t *testing.T) *ownedOrders {
	pool := testenv.Postgres(t)
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, run bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &ownedOrders{pool: pool, store: store}
}

func (o *ownedOrders) ServeHTTP(w nethttp.ResponseWriter, r *nethttp.Request) {
	run := o.runs.Add(1)
	tx, ok := pgstore.Tx(r.Context())
	if !ok {
		nethttp.Error(w, "no transaction", nethttp.StatusInternalServerError)
		return
	}
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO orders (run) VALUES ($1) RETURNING id`, run).Scan(&id); err != nil {
		nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
		return
	}
	if run == 1 && o.gate != nil {
		o.gate.Wait()
	}
	if run > 1 {
		o.fail = ""
	}
	switch o.fail {
	case "500":
		nethttp.Error(w, "database hiccup", nethttp.StatusInternalServerError)
		return
	case "panic":
		panic(nethttp.ErrAbortHandler)
	case "swallow":
		_, _ = tx.Exec(r.Context(), `SELECT 1/0`)
	}
	w.WriteHeader(nethttp.StatusCreated)
	fmt.Fprintf(w, `{"order":%d}`, id)
}

func (o *ownedOrders) count(t *testing.T) (n int) {
	if err := o.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ownedServer(t *testing.T, o *ownedOrders, guard request.Config) string {
	srv := serverWith(t, o.store, idemhttp.Config{OwnTransaction: true, Guard: guard}, o)
	srv.Config.ErrorLog = quietLog()
	return srv.URL
}

// TestOwnTransaction: the order and the record commit in the middleware's
// transaction; every retry replays the response and inserts nothing.
func TestOwnTransaction(t *testing.T) {
	t.Parallel()
	o := newOwnedOrders(t)
	url := ownedServer(t, o, request.Config{})
	key := quoted(uuid.NewString())
	first := post(t, url, key, "{}")
	if first.status != nethttp.StatusCreated || first.replayed() || first.header.Get(idemhttp.HeaderExpires) == "" {
		t.Fatalf("first: %+v", first)
	}
	for range 3 {
		if r := post(t, url, key, "{}"); r.body != first.body || !r.replayed() {
			t.Fatalf("retry: %+v, want %s replayed", r, first.body)
		}
	}
	if n, runs := o.count(t), o.runs.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d orders after %d runs, want 1 and 1", n, runs)
	}
}

// TestOwnTransactionDuplicates: concurrent duplicates wait on the key for
// the first request's transaction and get its response; past Guard.Wait
// they get a 409 with Retry-After.
func TestOwnTransactionDuplicates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		wait   time.Duration
		status int
	}{
		{"waits and replays", time.Minute, nethttp.StatusCreated},
		{"409 past the wait", 0, nethttp.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newOwnedOrders(t)
			o.gate = requesttest.NewGate(t)
			url := ownedServer(t, o, request.Config{Wait: tc.wait})
			key := quoted(uuid.NewString())
			replies := make(chan reply, 10)
			go func() { replies <- send(url, key, "{}") }()
			waitStarted(t, &o.runs, replies)
			for range 9 {
				go func() { replies <- send(url, key, "{}") }()
			}
			if tc.status == nethttp.StatusConflict {
				for range 9 {
					if r := recv(t, replies); r.status != nethttp.StatusConflict || r.header.Get("Retry-After") == "" || problemType(t, r) != idemhttp.ProblemInFlight {
						t.Fatalf("duplicate: %+v, want 409 in flight with Retry-After", r)
					}
				}
				o.gate.Open()
				if r := recv(t, replies); r.status != nethttp.StatusCreated || r.replayed() {
					t.Fatalf("first: %+v", r)
				}
			} else {
				time.Sleep(50 * time.Millisecond) // let the duplicates reach the key
				o.gate.Open()
				bodies := map[string]int{}
				for range 10 {
					r := recv(t, replies)
					if r.status != nethttp.StatusCreated {
						t.Fatalf("got %+v, want 201", r)
					}
					bodies[r.body]++
				}
				if len(bodies) != 1 {
					t.Fatalf("bodies %v, want one", bodies)
				}
			}
			if n, runs := o.count(t), o.runs.Load(); n != 1 || runs != 1 {
				t.Fatalf("%d orders after %d runs, want 1 and 1", n, runs)
			}
		})
	}
}

// TestOwnTransactionFailureLeavesNothing: a 5xx, a panic or a statement
// that failed rolls back the order with the claim: nothing is stored, and
// the retry runs the handler, whose order is the only one.
func TestOwnTransactionFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, fail := range []string{"500", "panic", "swallow"} {
		t.Run(fail, func(t *testing.T) {
			t.Parallel()
			o := newOwnedOrders(t)
			o.fail = fail
			url := ownedServer(t, o, request.Config{})
			key := quoted(uuid.NewString())
			first := send(url, key, "{}")
			if first.err == nil && first.status < 500 {
				t.Fatalf("failed attempt answered %+v", first)
			}
			if fail == "swallow" && problemType(t, first) != idemhttp.ProblemNotCommitted {
				t.Fatalf("swallowed error: %+v, want %s", first, idemhttp.ProblemNotCommitted)
			}
			if n := o.count(t); n != 0 {
				t.Fatalf("%d orders after the failure, want none", n)
			}
			if _, err := o.store.Get(context.Background(), request.ID{Key: key[1 : len(key)-1]}); !errors.Is(err, request.ErrNotFound) {
				t.Fatalf("record after the failure: %v, want none", err)
			}
			if r := post(t, url, key, "{}"); r.status != nethttp.StatusCreated || r.replayed() {
				t.Fatalf("retry: %+v, want 201", r)
			}
			if n := o.count(t); n != 1 {
				t.Fatalf("%d orders, want the retry's one", n)
			}
		})
	}
}

// TestOwnTransactionNeedsTxStore: a store that cannot own a transaction
// is refused at New.
func TestOwnTransactionNeedsTxStore(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	s := requesttest.Redis(t, rdb, prefix)
	if _, err := idemhttp.New(s, idemhttp.Config{OwnTransaction: true}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("New with a Redis store: %v, want ErrConfig", err)
	}
}
