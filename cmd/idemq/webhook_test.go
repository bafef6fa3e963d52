package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

func TestWebhookEndpoints(t *testing.T) {
	t.Parallel()
	url, pool, _ := database(t)
	mustRun(t, url, "migrate", "--components", "webhook,outbox")

	var added struct {
		endpointJSON
		Secret string `json:"secret"`
	}
	mustJSON(t, url, &added, "webhook", "add", "--url", "https://shop.example/hooks", "--id", "shop", "--event-type", "order.created")
	if added.ID != "shop" || !added.Enabled || !strings.HasPrefix(added.Secret, signing.SecretPrefix) {
		t.Fatalf("webhook add: %+v", added)
	}
	wantCode(t, url, exitUsage, "webhook", "add", "--url", "https://shop.example/other", "--id", "shop")
	wantCode(t, url, exitUsage, "webhook", "add", "--url", "ftp://shop.example/")
	wantCode(t, url, exitUsage, "webhook", "add")

	var ep endpointJSON
	mustJSON(t, url, &ep, "webhook", "disable", "shop", "--reason", "maintenance")
	if ep.Enabled || ep.DisabledReason != "maintenance" {
		t.Errorf("webhook disable: %+v", ep)
	}
	var stats statsReport
	mustJSON(t, url, &stats, "stats")
	if stats.WebhookEndpoints == nil || *stats.WebhookEndpoints != 1 || *stats.WebhookDisabled != 1 {
		t.Errorf("stats with a disabled endpoint: %+v", stats)
	}
	// A row held while the endpoint was disabled is due again at enable.
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO idemq_outbox (id, destination, payload, available_at)
		VALUES (gen_random_uuid(), 'webhook/shop', '{}', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	mustJSON(t, url, &ep, "webhook", "enable", "shop")
	if !ep.Enabled {
		t.Errorf("webhook enable: %+v", ep)
	}
	var waiting int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idemq_outbox WHERE available_at > now()`).Scan(&waiting); err != nil || waiting != 0 {
		t.Errorf("after enable %d rows still wait (%v), want the held row due", waiting, err)
	}
	var rotated map[string]string
	mustJSON(t, url, &rotated, "webhook", "rotate", "shop", "--grace", "1h")
	if !strings.HasPrefix(rotated["secret"], signing.SecretPrefix) || rotated["secret"] == added.Secret {
		t.Errorf("webhook rotate: %v", rotated)
	}
	reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := reg.Get(ctx, "shop")
	if err != nil || len(stored.Keys) != 2 {
		t.Errorf("after rotate with grace the endpoint signs with %d keys (%v), want the old and the new", len(stored.Keys), err)
	}
	var list []endpointJSON
	mustJSON(t, url, &list, "webhook", "list")
	if len(list) != 1 || list[0].Keys != 2 || !list[0].Enabled || list[0].EventTypes[0] != "order.created" {
		t.Errorf("webhook list: %+v", list)
	}
	if list[0].Breaker != "" || list[0].BreakerSince != nil || !strings.Contains(mustRun(t, url, "webhook", "list"), "BREAKER") {
		t.Errorf("webhook list before any breaker report: %+v", list[0])
	}
	// A relay's Sink reports its breaker on the row (transports/webhook
	// tests that); list shows the report.
	since := time.Now().Add(-90 * time.Second).Truncate(time.Microsecond)
	if _, err := pool.Exec(ctx, `UPDATE idemq_webhook_endpoints SET breaker_state = 'open', breaker_since = $1, breaker_relay = 'relay-a'
		WHERE id = 'shop'`, since); err != nil {
		t.Fatal(err)
	}
	mustJSON(t, url, &list, "webhook", "list")
	if len(list) != 1 || list[0].Breaker != "open" || list[0].BreakerSince == nil || !list[0].BreakerSince.Equal(since) || list[0].BreakerRelay != "relay-a" {
		t.Errorf("webhook list --json with an open breaker: %+v", list)
	}
	if out := mustRun(t, url, "webhook", "list"); !strings.Contains(out, "open 1m3") || !strings.Contains(out, "(relay-a)") {
		t.Errorf("webhook list with an open breaker does not show it open for 1m30s by relay-a:\n%s", out)
	}
	for _, args := range [][]string{{"enable", "nope"}, {"disable", "nope"}, {"rotate", "nope"}} {
		wantCode(t, url, exitNotFound, append([]string{"webhook"}, args...)...)
	}
	wantCode(t, url, exitUsage, "webhook", "enable")
}

// The relay delivers webhook rows to the registered endpoint, each
// webhook-id once with the trace context of its send span, and the
// registry's tables gate its start.
func TestRelayDeliversWebhooks(t *testing.T) {
	t.Parallel()
	url, _, ob := database(t)
	var (
		mu       sync.Mutex
		received = map[string]int{}
		untraced int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("webhook-signature") == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		received[r.Header.Get("webhook-id")]++
		if r.Header.Get("traceparent") == "" {
			untraced++
		}
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)

	wantCode(t, url, exitPending, "relay", "--webhooks") // the webhook tables are not migrated yet
	mustRun(t, url, "migrate", "--components", "webhook")
	mustRun(t, url, "webhook", "add", "--url", srv.URL, "--id", "shop")
	const n = 40
	ids := enqueue(t, ob, endpoints.DestinationPrefix+"shop", n, 3)

	addr := freeAddr(t)
	p := start(t, url, "relay", "--webhooks", "--webhook-allow-network", "127.0.0.0/8", "--http-addr", addr)
	idemqtest.WaitForNoError(t, "webhooks delivered", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(received) < n {
			return fmt.Errorf("%d of %d delivered", len(received), n)
		}
		return nil
	})
	idemqtest.WaitForNoError(t, "delivery metrics", func() error {
		_, body, err := get("http://" + addr + "/metrics")
		if err == nil && !strings.Contains(body, `idemq_webhook_deliveries_total{idemq_webhook_class="2xx",idemq_webhook_endpoint="shop"`) {
			err = fmt.Errorf("no delivery counter in /metrics")
		}
		return err
	})
	if code := p.signal(t, syscall.SIGTERM, time.Minute); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if untraced > 0 {
		t.Errorf("%d deliveries without a traceparent", untraced)
	}
	for _, id := range ids {
		if received[id] != 1 {
			t.Errorf("webhook %s delivered %d times, want 1", id, received[id])
		}
	}
}

// SIGTERM while a delivery hangs: the relay exits after its shutdown grace,
// and the row it had in flight is released, not lost: the next relay
// delivers it.
func TestRelaySIGTERMReleasesAHangingDelivery(t *testing.T) {
	t.Parallel()
	url, _, ob := database(t)
	hang := make(chan struct{})
	arrived := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get("webhook-id")
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	mustRun(t, url, "migrate", "--components", "webhook")
	mustRun(t, url, "webhook", "add", "--url", srv.URL, "--id", "slow")
	ids := enqueue(t, ob, endpoints.DestinationPrefix+"slow", 1, 1)

	args := []string{"relay", "--webhooks", "--webhook-allow-network", "127.0.0.0/8", "--shutdown-grace", "1s"}
	p := start(t, url, args...)
	if id := receive(t, arrived); id != ids[0] {
		t.Fatalf("delivery of %s, want %s", id, ids[0])
	}
	if code := p.signal(t, syscall.SIGTERM, time.Second+30*time.Second); code != 0 {
		t.Fatalf("relay exit %d after SIGTERM", code)
	}
	if n := pending(t, ob); n != 1 {
		t.Fatalf("%d rows pending after the relay released its hanging batch, want 1", n)
	}

	close(hang)
	start(t, url, args...)
	if id := receive(t, arrived); id != ids[0] {
		t.Fatalf("second delivery of %s, want the same webhook-id %s", id, ids[0])
	}
	idemqtest.WaitForNoError(t, "delivered", func() error {
		if n := pending(t, ob); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
}

// receive waits for a value from c, up to a generous deadline.
func receive[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(2 * time.Minute):
		t.Fatal("nothing arrived")
		panic("unreachable")
	}
}
