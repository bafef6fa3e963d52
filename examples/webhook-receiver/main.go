// Command webhook-receiver is an HTTP endpoint that receives Standard
// Webhooks (https://www.standardwebhooks.com) and applies each one once,
// whoever sends them: idemq's webhook Sink, Svix, or any other sender.
//
// A webhook.Receiver verifies the signature and hands the delivery to a
// consumer.Consumer: the handler's writes and the inbox record of the
// webhook-id commit in one transaction. The sender here delivers a batch of
// "order.shipped" events, delivers some of them a second time at the same
// moment (a sender that timed out and retried), sends one with a wrong
// signature, and reuses one webhook-id with another body. The endpoint
// answers 200 to a delivery and to its duplicate, 401 to the forgery, 409 to
// the reused id, and books each shipment once. It prints the statuses and
// the table, and exits non-zero unless the counts are right.
//
// It runs as a module of its own: copy this file into a new module and `go
// run .`. It needs Postgres at DATABASE_URL (default
// postgres://postgres@127.0.0.1:5432/postgres), where it drops and recreates
// the schema webhook_receiver on every run.
package main

import (
	"bytes"
	"cmp"
	"context"
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

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/signing"
)

const (
	events = 25 // distinct webhooks delivered
	twice  = 6  // of which delivered twice at once

	schema = "webhook_receiver" // holds the example's tables; recreated on every run
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
		fmt.Fprintf(os.Stderr, "webhook-receiver: %v\n", err)
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

// run is what a service of your own would do, with its pool.
func run(ctx context.Context, pool *pgxpool.Pool, out io.Writer) error {
	// No unique constraint: a webhook applied twice would show as two rows.
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (seq bigserial PRIMARY KEY, webhook_id text NOT NULL, body text NOT NULL)`); err != nil {
		return err
	}

	// The secret the sender gave us ("whsec_..."); list the old and the new
	// one while the sender rotates.
	secret := signing.NewSecret()

	// The receiving side: a consumer whose handler runs in the transaction
	// that records the webhook-id, behind the verifying Receiver.
	c, err := consumer.New(pool, "partner-webhooks", webhook.Handle(func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (webhook_id, body) VALUES ($1, $2)`, d.ID, d.Body)
		return err
	}), consumer.Config{Redeliver: true, Inbox: inbox.Config{Schema: schema}}) // a failed attempt answers 503 at once; the sender's schedule spaces retries
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil { // once, at deploy time (or `idemq migrate --components inbox`)
		return err
	}
	receiver, err := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{secret}})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks", receiver)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown(context.Background())
	url := "http://" + ln.Addr().String() + "/webhooks"

	// The sender.
	s, err := newSender(url, secret)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for i := range events {
		id, body := fmt.Sprintf("msg_%03d", i), fmt.Sprintf(`{"type":"order.shipped","order":%d}`, i)
		copies := 1
		if i < twice { // the same delivery twice, at the same moment
			copies = 2
		}
		for range copies {
			wg.Go(func() { s.send(ctx, id, body, s.keys) })
		}
	}
	wg.Wait()
	forged, err := signing.ParseKeys(signing.NewSecret())
	if err != nil {
		return err
	}
	s.send(ctx, "msg_forged", `{"type":"order.shipped","order":-1}`, forged)
	s.send(ctx, "msg_000", `{"type":"order.shipped","order":1000}`, s.keys) // a webhook-id reused with another body
	if s.err != nil {
		return s.err
	}

	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT webhook_id) FROM shipments`).Scan(&rows, &distinct); err != nil {
		return err
	}
	fmt.Fprintf(out, "sent %d deliveries: %d webhooks, %d of them twice at once, 1 forged, 1 id reused with another body\n",
		events+twice+2, events, twice)
	fmt.Fprintf(out, "answers: %d × 200, %d × 401, %d × 409\n", s.status[200], s.status[401], s.status[409])
	fmt.Fprintf(out, "shipments: %d rows for %d webhooks\n", rows, distinct)
	if rows != events || distinct != events || s.status[200] != events+twice || s.status[401] != 1 || s.status[409] != 1 {
		return fmt.Errorf("want %d × 200, 1 × 401, 1 × 409 and %d rows", events+twice, events)
	}
	fmt.Fprintln(out, "ok: every webhook applied exactly once")
	return nil
}

// sender delivers signed webhooks as a Standard Webhooks sender does,
// retrying a 503 after its Retry-After, and counts the final statuses.
type sender struct {
	url  string
	keys []signing.Key

	mu     sync.Mutex
	status map[int]int
	err    error
}

func newSender(url, secret string) (*sender, error) {
	keys, err := signing.ParseKeys(secret)
	return &sender{url: url, keys: keys, status: map[int]int{}}, err
}

func (s *sender) send(ctx context.Context, id, body string, keys []signing.Key) {
	for {
		status, retryAfter, err := s.post(ctx, id, body, keys)
		if err == nil && status == http.StatusServiceUnavailable {
			time.Sleep(retryAfter)
			continue
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.status[status]++
		s.err = errors.Join(s.err, err)
		return
	}
}

func (s *sender) post(ctx context.Context, id, body string, keys []signing.Key) (status int, retryAfter time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(signing.HeaderID, id)
	req.Header.Set(signing.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(signing.HeaderSignature, signing.Sign(keys, id, now, []byte(body)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return resp.StatusCode, time.Duration(max(secs, 1)) * time.Second, nil
}
