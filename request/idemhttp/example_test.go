package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
)

// A handler that creates an order and records the request in the same
// transaction: a retry with the same key gets the stored response, and the
// order exists once.
func ExampleRecord() {
	ctx := context.Background()
	pool, done, err := testenv.ScratchPool(ctx, "example_http")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer done()
	store, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, sku text)`); err != nil {
		fmt.Println(err)
		return
	}

	createOrder := func(w nethttp.ResponseWriter, r *nethttp.Request) {
		sku, _ := io.ReadAll(r.Body)
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(r.Context(), `INSERT INTO orders (sku) VALUES ($1) RETURNING id`, string(sku)).Scan(&id); err != nil {
				return err
			}
			w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
			w.WriteHeader(nethttp.StatusCreated)
			fmt.Fprintf(w, "order %d", id)
			// The request record commits with the order, or neither does.
			return idemhttp.Record(r, func(l idemq.Lease, resp request.Response) error {
				return store.CompleteTx(r.Context(), tx, l, resp)
			})
		})
		if err != nil {
			nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
		}
	}
	m, err := idemhttp.New(store, idemhttp.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(m.Wrap(nethttp.HandlerFunc(createOrder)))
	defer srv.Close()

	for range 2 {
		req, _ := nethttp.NewRequest(nethttp.MethodPost, srv.URL+"/orders", strings.NewReader("sku-1"))
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := nethttp.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), resp.Header.Get("Location"), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	var orders int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders)
	fmt.Println("orders:", orders)
	// Output:
	// 201 order 1 /orders/1 replayed: false
	// 201 order 1 /orders/1 replayed: true
	// orders: 1
}
