package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/idemhttp"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// orderRequest is the body of POST /orders.
type orderRequest struct {
	Customer string `json:"customer"`
	Item     string `json:"item"`
	Qty      int    `json:"qty"`
}

// api is the orders service: POST /orders behind the Idempotency-Key
// middleware on a Postgres request store. One transaction inserts the
// order, enqueues its messages for the billing (Kafka) and shipping
// (JetStream) consumers, fans the "order.created" webhook out to the
// registered endpoints and records the response under the key: a retry
// with the same key replays that response and creates nothing.
type api struct {
	pool  *pgxpool.Pool
	store *pgstore.Store
	ob    *outbox.Outbox
	pub   *endpoints.Publisher
	legs  []leg

	mu   sync.Mutex
	sent map[string][]relay.Message // per leg, the messages committed, for the producer's re-sends
}

func (a *api) createOrder(w nethttp.ResponseWriter, r *nethttp.Request) {
	var in orderRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Customer == "" || in.Qty <= 0 {
		nethttp.Error(w, "a customer, an item and a positive qty are required", nethttp.StatusBadRequest)
		return
	}
	ctx := r.Context()
	var msgs []outbox.Message
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO orders (customer, item, qty) VALUES ($1, $2, $3) RETURNING id`,
			in.Customer, in.Item, in.Qty).Scan(&id); err != nil {
			return err
		}
		payload := fmt.Appendf(nil, `{"order_id":%d,"customer":%q,"item":%q,"qty":%d}`, id, in.Customer, in.Item, in.Qty)
		msgs = make([]outbox.Message, len(a.legs))
		for i, l := range a.legs {
			// Keyed by customer: a customer's orders stay in order.
			msgs[i] = outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: l.Destination(), Key: in.Customer,
				Payload: payload, Headers: map[string]string{"Content-Type": "application/json"}}
		}
		if err := a.ob.EnqueueTx(ctx, tx, msgs...); err != nil {
			return err
		}
		if _, err := a.pub.PublishTx(ctx, tx, endpoints.Event{Type: "order.created", Key: in.Customer, Data: payload}); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(nethttp.StatusCreated)
		_, _ = w.Write(payload)
		// The request record commits with the order, or neither does.
		return idemhttp.Record(r, func(l idemq.Lease, resp request.Response) error {
			return a.store.CompleteTx(ctx, tx, l, resp)
		})
	})
	if err != nil {
		nethttp.Error(w, err.Error(), nethttp.StatusInternalServerError)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, l := range a.legs {
		a.sent[l.Name()] = append(a.sent[l.Name()], relay.Message{Message: msgs[i]})
	}
}

// serve starts the API on a loopback port.
func (a *api) serve() (*httptest.Server, error) {
	m, err := idemhttp.New(a.store, idemhttp.Config{})
	if err != nil {
		return nil, err
	}
	mux := nethttp.NewServeMux()
	mux.Handle("POST /orders", m.Wrap(nethttp.HandlerFunc(a.createOrder)))
	return httptest.NewServer(mux), nil
}

// clientCounts is what the clients saw.
type clientCounts struct {
	requests, created, replays, rejected int
}

// post sends one POST /orders with key and returns the status and whether
// the middleware replayed a stored response.
func post(ctx context.Context, url, key string, body orderRequest) (status int, replayed bool, err error) {
	b, _ := json.Marshal(body)
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodPost, url+"/orders", bytes.NewReader(b))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := nethttp.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed) == "true", nil
}

// placeOrders is the clients: n orders, each under its own key. Every
// retryEvery-th is sent again with the same key, as a client whose first
// answer was lost would (the API must replay it, not create a second
// order); the last one's key is then reused with another body, a client
// bug the API must refuse with 422.
func placeOrders(ctx context.Context, url string, n, retryEvery int) (clientCounts, error) {
	var c clientCounts
	send := func(key string, body orderRequest) (int, error) {
		status, replayed, err := post(ctx, url, key, body)
		if err != nil {
			return 0, err
		}
		c.requests++
		switch {
		case replayed:
			c.replays++
		case status == nethttp.StatusCreated:
			c.created++
		case status == nethttp.StatusUnprocessableEntity:
			c.rejected++
		default:
			return status, fmt.Errorf("POST /orders with key %s: unexpected status %d", key, status)
		}
		return status, nil
	}
	var key string
	var body orderRequest
	for i := range n {
		key = uuid.NewString()
		body = orderRequest{Customer: fmt.Sprintf("customer-%d", i%17), Item: fmt.Sprintf("item-%d", i%5), Qty: 1 + i%3}
		if _, err := send(key, body); err != nil {
			return c, err
		}
		if i%retryEvery == 0 {
			if _, err := send(key, body); err != nil {
				return c, err
			}
		}
	}
	body.Qty += 10
	status, err := send(key, body)
	if err == nil && status != nethttp.StatusUnprocessableEntity {
		err = fmt.Errorf("a reused key with another body got %d, want 422", status)
	}
	return c, err
}
