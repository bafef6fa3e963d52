package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// TestReceiverHandlerSharesTheInboxTransaction: the handler's writes and
// the webhook-id's record commit together: a failing handler leaves none
// of its writes, only its counted failure, and 503 with the Retry-After
// it asked for (the retry applies it); a successful one commits both,
// once.
func TestReceiverHandlerSharesTheInboxTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE paid (invoice text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	secret := signing.NewSecret()
	calls := 0
	srv := httptest.NewServer(newWebhookReceiver(t, b, secret, func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		calls++
		if _, err := tx.Exec(ctx, `INSERT INTO paid VALUES ('inv_1')`); err != nil {
			return err
		}
		if calls == 1 {
			return idemq.RetryAfter(errors.New("downstream busy"), 3*time.Second)
		}
		return nil
	}))
	t.Cleanup(srv.Close)
	keys, _ := signing.ParseKeys(secret)
	body := `{"type":"invoice.paid","data":{}}`
	post := func() *http.Response {
		now := time.Now()
		return postSigned(t, srv.URL, "msg_1", now, signing.Sign(keys, "msg_1", now, []byte(body)), body)
	}
	count := func() (paid, records int) {
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM paid), (SELECT count(*) FROM idemq_inbox)`).Scan(&paid, &records); err != nil {
			t.Fatal(err)
		}
		return paid, records
	}
	resp := post()
	if paid, _ := count(); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "3" || paid != 0 {
		t.Fatalf("failing handler: status %d, Retry-After %q, %d rows; want 503, 3, none",
			resp.StatusCode, resp.Header.Get("Retry-After"), paid)
	}
	if rec, err := b.inbox.Get(b.ctx, "webhook", "msg_1"); err != nil || rec.Status != inbox.FailedRetryable || rec.Failures != 1 {
		t.Fatalf("after the failure: %+v, %v; want FAILED_RETRYABLE with 1 failure", rec, err)
	}
	for range 2 {
		if resp := post(); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200", resp.StatusCode)
		}
	}
	if paid, records := count(); calls != 2 || paid != 1 || records != 1 {
		t.Fatalf("after the retry and a duplicate: %d calls, %d rows, %d records; want 2, 1, 1", calls, paid, records)
	}
}

// TestReceiverCountsFailuresUpToADeadLetter: the consumer under the
// Receiver counts every failed attempt across deliveries (a panic
// included) toward Retry.MaxAttempts, answers 503 with Retry-After until
// then, and then dead-letters the webhook through its hook, answering 422
// with "webhook-delivery: abort-message" from then on; OnResult sees every
// delivery.
func TestReceiverCountsFailuresUpToADeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := signing.NewSecret()
	keys, _ := signing.ParseKeys(secret)
	calls := 0
	var dead []string
	var outcomes []consumer.Outcome
	c, err := consumer.New(b.pool, "webhook", webhook.Handle(func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		calls++
		if calls == 2 {
			panic("handler bug")
		}
		return errors.New("downstream refuses")
	}), consumer.Config{
		Redeliver: true,
		Retry:     idemq.Retry{MaxAttempts: 3},
		Logger:    quiet,
		DeadLetter: func(ctx context.Context, tx pgx.Tx, msg *consumer.Message, cause error) error {
			d, ok := webhook.DeliveryOf(msg)
			if !ok {
				return errors.New("the dead letter is not a webhook")
			}
			dead = append(dead, d.ID)
			return nil
		},
		Hooks: consumer.Hooks{OnResult: func(e consumer.ResultEvent) { outcomes = append(outcomes, e.Outcome) }},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(receiverOn(t, c, secret))
	t.Cleanup(srv.Close)
	post := func() *http.Response {
		now := time.Now()
		return postSigned(t, srv.URL, "msg_1", now, signing.Sign(keys, "msg_1", now, []byte(`{}`)), `{}`)
	}
	for i := range 2 {
		if resp := post(); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("failed attempt %d: %d, Retry-After %q; want 503 with Retry-After", i+1, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	for range 2 {
		resp := post()
		if resp.StatusCode != http.StatusUnprocessableEntity || resp.Header.Get(webhook.HeaderDelivery) != webhook.AbortMessage {
			t.Fatalf("after the third failure: %d, %q; want 422 with abort-message", resp.StatusCode, resp.Header.Get(webhook.HeaderDelivery))
		}
	}
	want := []consumer.Outcome{consumer.Retry, consumer.Retry, consumer.DeadLettered, consumer.DeadLettered}
	if calls != 3 || len(dead) != 1 || dead[0] != "msg_1" || !slices.Equal(outcomes, want) {
		t.Fatalf("%d handler runs, dead letters %v, outcomes %v; want 3 runs, msg_1 dead-lettered once, %v", calls, dead, outcomes, want)
	}
	rec, err := b.inbox.Get(b.ctx, "webhook", "msg_1")
	if err != nil || rec.Status != inbox.FailedFinal || rec.Failures != 3 {
		t.Fatalf("record %+v, %v; want FAILED_FINAL after 3 failures", rec, err)
	}
}

// TestReceiverDatabaseOutage: while the database is down every webhook
// gets 503 with a Retry-After from the Receiver's backoff (capped by
// Retry.MaxDelay), the log says once that the database is gone and once
// that it is back with the count of the webhooks that waited, and the
// webhooks sent again are applied once. A negative Retry delay is refused.
func TestReceiverDatabaseOutage(t *testing.T) {
	t.Parallel()
	pool, proxy := testenv.PostgresBehindProxy(t)
	ctx := context.Background()
	c, err := consumer.New(pool, "webhook", webhook.Handle(func(context.Context, pgx.Tx, webhook.Delivery) error { return nil }), consumer.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	secret := signing.NewSecret()
	keys, _ := signing.ParseKeys(secret)
	if _, err := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{secret}, Retry: idemq.Retry{BaseDelay: -time.Second}}); !errors.Is(err, idemq.ErrConfig) {
		t.Fatalf("negative Retry.BaseDelay: %v, want ErrConfig", err)
	}
	var logs testenv.Logs
	recv, err := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{secret}, Retry: idemq.Retry{BaseDelay: time.Second, MaxDelay: 4 * time.Second}, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	send := func(id string) *http.Response {
		now := time.Now()
		return postSigned(t, srv.URL, id, now, signing.Sign(keys, id, now, []byte("{}")), "{}")
	}
	if resp := send("msg_before"); resp.StatusCode != http.StatusOK {
		t.Fatalf("before the outage: %d", resp.StatusCode)
	}
	proxy.Cut()
	ids := []string{"msg_1", "msg_2", "msg_3"}
	for range 3 {
		for _, id := range ids {
			resp := send(id)
			after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if resp.StatusCode != http.StatusServiceUnavailable || err != nil || after < 1 || after > 4 {
				t.Fatalf("during the outage: %d, Retry-After %q; want 503 and 1 to 4 s", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
		}
	}
	proxy.Restore()
	for _, id := range ids {
		if resp := send(id); resp.StatusCode != http.StatusOK {
			t.Fatalf("after the outage: %s got %d", id, resp.StatusCode)
		}
	}
	gone, back := logs.Records("idemq: database unavailable"), logs.Records("idemq: database available again")
	if len(gone) != 1 || len(back) != 1 || back[0].Attrs["waited"] != "3" {
		t.Fatalf("outage lines %+v and %+v; want one each, the second with waited=3", gone, back)
	}
	for _, id := range ids {
		if rec, err := c.Store().Get(ctx, "webhook", id); err != nil || rec.Status != inbox.Succeeded {
			t.Fatalf("%s: %+v, %v; want it applied", id, rec, err)
		}
	}
}
