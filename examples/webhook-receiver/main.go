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
// It needs Postgres: the local server (IDEMQ_TEST_DATABASE_URL points it
// elsewhere) or, when nothing answers there, a private one started from the
// machine's Postgres binaries.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/signing"
)

const (
	events = 25 // distinct webhooks delivered
	twice  = 6  // of which delivered twice at once
)

// main makes sure Postgres answers (or starts a private one), then runs the
// scenario; run is what a service of your own would do.
func main() { testenv.Main("webhook-receiver", 2*time.Minute, run) }

func run(ctx context.Context, out io.Writer) error {
	pool, done, err := testenv.ScratchPool(ctx, "idemq_webhook_receiver")
	if err != nil {
		return err
	}
	defer done()
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
	}), consumer.Config{Redeliver: true}) // a failed attempt answers 503 at once; the sender's schedule spaces retries
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
