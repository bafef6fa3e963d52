package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"code.dny.dev/ssrf"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// TestKeyRotationOverlap: after a rotation with a grace period, every
// delivery carries signatures by the old and the new key, so a receiver
// that still has only the old key and one that has only the new key both
// verify it.
func TestKeyRotationOverlap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, nil)
	ep, old := addEndpoint(t, b, rc.srv.URL, nil)
	runRelay(t, b, fastSink(t, b, webhook.Config{}), relay.Config{})
	publish(t, b, event("k", 0))
	idemqtest.WaitFor(t, "the first delivery", func() bool { return rc.count() == 1 })

	newPrivate, newPublic := signing.NewSigningKey()
	if err := b.reg.RotateKey(b.ctx, ep.ID, newPrivate, time.Hour); err != nil {
		t.Fatal(err)
	}
	got, err := b.reg.Get(b.ctx, ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Keys) != 2 {
		t.Fatalf("keys during the overlap: %d, want 2", len(got.Keys))
	}
	time.Sleep(50 * time.Millisecond) // past the Sink's RefreshInterval
	publish(t, b, event("k", 1))
	idemqtest.WaitFor(t, "the second delivery", func() bool { return rc.count() == 2 })

	verifies := func(h hit, key string) bool {
		keys, err := signing.ParseKeys(key)
		if err != nil {
			t.Fatal(err)
		}
		return signing.Verify(keys, h.id, h.header.Get(signing.HeaderTimestamp), h.header.Get(signing.HeaderSignature), h.body, time.Minute, time.Now()) == nil
	}
	hits := rc.all()
	if !verifies(hits[0], old) || verifies(hits[0], newPublic) {
		t.Fatal("before the rotation: want the old key only")
	}
	if !verifies(hits[1], old) || !verifies(hits[1], newPublic) {
		t.Fatalf("during the overlap: want both keys to verify %q", hits[1].header.Get(signing.HeaderSignature))
	}
	// A rotation with no grace retires the old keys at once.
	if err := b.reg.RotateKey(b.ctx, ep.ID, signing.NewSecret(), 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.reg.Get(b.ctx, ep.ID); len(got.Keys) != 2 {
		t.Fatalf("after a second rotation: %d keys, want 2 (the one in its grace and the new one)", len(got.Keys))
	}
}

// TestReceiverRejectsAndRecordsNothing: bad signatures, stale and future
// timestamps and tampered bodies get 401, the handler never runs and the
// inbox stays empty; the genuine message is applied once.
func TestReceiverRejectsAndRecordsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := signing.NewSecret()
	applied := 0
	srv := httptest.NewServer(newWebhookReceiver(t, b, secret, func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		applied++
		return nil
	}))
	t.Cleanup(srv.Close)
	keys, _ := signing.ParseKeys(secret)
	wrong, _ := signing.ParseKeys(signing.NewSecret())
	body := `{"type":"a.b","data":{}}`
	post := func(id string, at time.Time, sig, body string) int {
		return postSigned(t, srv.URL, id, at, sig, body).StatusCode
	}
	now := time.Now()
	for name, status := range map[string]int{
		"bad signature": post("m1", now, signing.Sign(wrong, "m1", now, []byte(body)), body),
		"stale":         post("m2", now.Add(-6*time.Minute), signing.Sign(keys, "m2", now.Add(-6*time.Minute), []byte(body)), body),
		"future":        post("m3", now.Add(6*time.Minute), signing.Sign(keys, "m3", now.Add(6*time.Minute), []byte(body)), body),
		"tampered body": post("m4", now, signing.Sign(keys, "m4", now, []byte(body)), body+" "),
		"no signature":  post("m5", now, "", body),
	} {
		if status != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, status)
		}
	}
	var records int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idemq_inbox`).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if applied != 0 || records != 0 {
		t.Fatalf("after rejected requests: applied %d, %d inbox records; want none", applied, records)
	}
	good := signing.Sign(keys, "m6", now, []byte(body))
	for range 2 {
		if status := post("m6", now, good, body); status != http.StatusOK {
			t.Fatalf("genuine message: status %d", status)
		}
	}
	if applied != 1 {
		t.Fatalf("genuine message posted twice: applied %d times, want once", applied)
	}
	// The same id with another (correctly signed) body is a conflict.
	other := `{"type":"a.b","data":{"x":1}}`
	if resp := postSigned(t, srv.URL, "m6", now, signing.Sign(keys, "m6", now, []byte(other)), other); resp.StatusCode != http.StatusConflict ||
		resp.Header.Get(webhook.HeaderDelivery) != webhook.AbortMessage {
		t.Fatalf("reused id with another body: status %d, %q; want 409 with abort-message", resp.StatusCode, resp.Header.Get(webhook.HeaderDelivery))
	}
}

// TestSSRFRefusedByDefault: with the default guard, loopback, private,
// link-local and metadata addresses are refused before any connection,
// also behind a DNS name; a redirect is never followed.
func TestSSRFRefusedByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	target := newReceiver(t, nil) // on 127.0.0.1: must never be reached
	_, port, _ := net.SplitHostPort(target.srv.Listener.Addr().String())
	v6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	v6srv := &http.Server{Handler: http.HandlerFunc(target.serve)}
	go func() { _ = v6srv.Serve(v6) }() // closed at cleanup
	t.Cleanup(func() { v6srv.Close() })
	_, v6port, _ := net.SplitHostPort(v6.Addr().String())

	urls := []string{
		"http://127.0.0.1:" + port,
		"http://[::1]:" + v6port,
		"http://localhost:" + port,
		"http://10.0.0.1:" + port,
		"http://169.254.169.254/latest/meta-data",
	}
	sink, err := webhook.NewSink(b.reg, webhook.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var batch []relay.Message
	for i, u := range urls {
		ep, _ := addEndpoint(t, b, u, func(e *endpoints.Endpoint) { e.ID = fmt.Sprint("ep", i) })
		batch = append(batch, relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: endpoints.DestinationPrefix + ep.ID, Payload: []byte(`{}`)}})
	}
	err = sink.Publish(b.ctx, 0, batch)
	var pe *relay.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != len(urls) {
		t.Fatalf("Publish: %v, want every message failed", err)
	}
	for i, u := range urls {
		if e := pe.Failed[i]; !idemq.IsPermanent(e) || !errors.Is(e, ssrf.ErrProhibitedIP) {
			t.Errorf("%s: %v, want a permanent ssrf.ErrProhibitedIP", u, e)
		}
	}
	if target.count() != 0 {
		t.Fatalf("the guarded receiver was reached %d times", target.count())
	}

	// A redirect from an allowed receiver to the guarded one fails and is
	// not followed.
	redirect := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		http.Redirect(w, r, "http://[::1]:"+v6port+"/", http.StatusTemporaryRedirect)
		return true
	})
	ep, _ := addEndpoint(t, b, redirect.srv.URL, func(e *endpoints.Endpoint) { e.ID = "redirect" })
	allowV4, err := webhook.NewSink(b.reg, webhook.Config{Logger: quiet, AllowedNetworks: loopback[:1]})
	if err != nil {
		t.Fatal(err)
	}
	err = allowV4.Publish(b.ctx, 0, []relay.Message{{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: endpoints.DestinationPrefix + ep.ID, Payload: []byte(`{}`)}}})
	var de *webhook.DeliveryError
	if !errors.As(err, &pe) || !errors.As(pe.Failed[0], &de) || de.Status != http.StatusTemporaryRedirect || idemq.IsPermanent(pe.Failed[0]) {
		t.Fatalf("redirect: %v, want a retryable 307 failure", err)
	}
	if redirect.count() != 1 || target.count() != 0 {
		t.Fatalf("redirect: %d requests to the redirector, %d to its target; want 1 and 0", redirect.count(), target.count())
	}
}

// postSigned posts body to url with the given webhook headers.
func postSigned(t *testing.T, url, id string, at time.Time, sig, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set(signing.HeaderID, id)
	req.Header.Set(signing.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(signing.HeaderSignature, sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}
