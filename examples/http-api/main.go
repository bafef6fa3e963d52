// Command http-api is an HTTP API whose POST is safe to retry: the
// Idempotency-Key middleware (request/idemhttp) on the Postgres request
// store (request/pgstore), and nothing else of idemq.
//
// POST /payments books a payment. Its effects are all in Postgres, so the
// middleware runs it in the transaction-owning mode
// (idemhttp.Config.OwnTransaction): it begins the transaction with the
// claim of the client's Idempotency-Key, the handler books the payment in
// it (pgstore.Tx), and the response is stored in it with the one COMMIT, so
// "booked" and "answered" cannot diverge. (Effects outside Postgres, such
// as a call to a payment provider, would need the default leased mode.)
// The clients retry: some send a request again after its answer (a lost
// response), some send two copies at once (a retry racing the original: it
// waits for the first one's transaction and gets its answer), one reuses a
// key with another amount (422) and one forgets the key (400). Every retry
// gets the first answer, replayed with "Idempotent-Replayed: true". It prints
// what the clients saw and the table, and exits non-zero unless each payment
// was booked once.
//
// It runs as a module of its own: copy this file into a new module and `go
// run .`. It needs Postgres at DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), where it drops and recreates
// the schema http_api on every run.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
)

const (
	payments = 20 // distinct payments (keys)
	retried  = 5  // sent again after their answer
	raced    = 4  // sent twice at once

	schema = "http_api" // holds the example's tables; recreated on every run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err := func() error {
		pool, err := openPool(ctx, cmp.Or(os.Getenv("DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres"))
		if err != nil {
			return err
		}
		defer pool.Close()
		return run(ctx, pool, os.Stdout)
	}()
	cancel()
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "http-api: %v\n", err)
		os.Exit(1)
	}
}

// openPool opens a pool on connString whose connections work in schema,
// which it drops and recreates first so that every run starts empty.
func openPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	name := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{"DROP SCHEMA IF EXISTS " + name + " CASCADE", "CREATE SCHEMA " + name} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: %w", err)
		}
	}
	return pool, nil
}

// payment is the body of POST /payments and of its answer.
type payment struct {
	ID     int64  `json:"id,omitempty"`
	Payer  string `json:"payer"`
	Amount int    `json:"amount"`
}

// api is the payments service.
type api struct{}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Payer == "" || p.Amount <= 0 {
		http.Error(w, "a payer and a positive amount are required", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tx, _ := pgstore.Tx(ctx) // the request's transaction: the middleware commits it
	if err := tx.QueryRow(ctx, `INSERT INTO payments (payer, amount) VALUES ($1, $2) RETURNING id`, p.Payer, p.Amount).Scan(&p.ID); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError) // a 5xx rolls the transaction back
		return
	}
	time.Sleep(100 * time.Millisecond) // more work in the transaction: a racing retry arrives meanwhile
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", p.ID))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(p) // stored with the payment, in the same COMMIT
}

// run is what a service of your own would do, with its pool.
func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	// No unique constraint: a request run twice would book two rows.
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, payer text NOT NULL, amount int NOT NULL)`); err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Config{Schema: schema})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil { // once, at deploy time
		return err
	}
	// POST and PATCH need a key; keys kept 24 h; each request in its transaction.
	m, err := idemhttp.New(store, idemhttp.Config{OwnTransaction: true})
	if err != nil {
		return err
	}
	a := &api{}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", m.Wrap(http.HandlerFunc(a.createPayment)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown(context.Background())

	c := &client{url: "http://" + ln.Addr().String() + "/payments", seen: map[string]int{}}
	var wg sync.WaitGroup
	for i := range payments {
		key, p := fmt.Sprintf("pay-key-%03d", i), payment{Payer: fmt.Sprintf("payer-%d", i%4), Amount: 100 + i}
		switch {
		case i < raced: // two copies at once
			wg.Go(func() { c.send(ctx, key, p) })
			wg.Go(func() { c.send(ctx, key, p) })
		case i < raced+retried: // again after the answer
			wg.Go(func() { c.send(ctx, key, p); c.send(ctx, key, p) })
		default:
			wg.Go(func() { c.send(ctx, key, p) })
		}
	}
	wg.Wait()
	c.send(ctx, "pay-key-000", payment{Payer: "payer-0", Amount: 1}) // the key of another payment
	c.send(ctx, "", payment{Payer: "payer-0", Amount: 1})            // no key
	if c.err != nil {
		return c.err
	}

	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&rows); err != nil {
		return err
	}
	fmt.Fprintf(out, "clients sent %d payments: %d again after the answer, %d twice at once, 1 key reused with another amount, 1 without a key\n",
		payments, retried, raced)
	fmt.Fprintf(out, "answers: %d created, %d replayed, %d × 409 in flight (retried after Retry-After), %d × 422, %d × 400\n",
		c.seen["created"], c.seen["replayed"], c.seen["409"], c.seen["422"], c.seen["400"])
	fmt.Fprintf(out, "payments table: %d rows\n", rows)
	if rows != payments || c.seen["created"] != payments || c.seen["replayed"] != retried+raced || c.seen["422"] != 1 || c.seen["400"] != 1 {
		return fmt.Errorf("want %d rows, %d created, %d replayed, 1 × 422 and 1 × 400", payments, payments, retried+raced)
	}
	fmt.Fprintln(out, "ok: every payment booked exactly once, every retry answered with the first response")
	return nil
}

// client posts payments as a client that retries would, and counts what it
// saw. A 409 (the first request with the key is still running) is retried
// after its Retry-After.
type client struct {
	url string

	mu   sync.Mutex
	seen map[string]int
	err  error
}

func (c *client) send(ctx context.Context, key string, p payment) {
	for {
		status, replayed, retryAfter, err := c.post(ctx, key, p)
		c.mu.Lock()
		switch {
		case err != nil:
			c.err = errors.Join(c.err, err)
		case status == http.StatusConflict:
			c.seen["409"]++
		case status == http.StatusCreated && replayed:
			c.seen["replayed"]++
		case status == http.StatusCreated:
			c.seen["created"]++
		default:
			c.seen[strconv.Itoa(status)]++
		}
		c.mu.Unlock()
		if err != nil || status != http.StatusConflict {
			return
		}
		time.Sleep(retryAfter)
	}
}

func (c *client) post(ctx context.Context, key string, p payment) (status int, replayed bool, retryAfter time.Duration, err error) {
	body, err := json.Marshal(p)
	if err != nil {
		return 0, false, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return 0, false, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed) == "true", time.Duration(max(secs, 1)) * time.Second, nil
}
