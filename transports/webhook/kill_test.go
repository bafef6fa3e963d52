package webhook_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// TestRelayKilledBetweenPostAndDelete runs the relay in a child process
// (this test binary re-executed) and SIGKILLs it while the receiver holds
// the response to the first POST, after applying it: the relay never
// deletes the row. A second relay delivers the row again with the same
// webhook-id; the receiver's middleware acknowledges the duplicate without
// applying it a second time.
func TestRelayKilledBetweenPostAndDelete(t *testing.T) {
	if url, ok := relaytest.ChildArgs(t); ok {
		relayChild(t, url)
		return
	}
	t.Parallel()
	url := testenv.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setupOn(t, pool)

	secret := signing.NewSecret()
	var applied atomic.Int64
	app := newWebhookReceiver(t, b, secret, func(ctx context.Context, tx pgx.Tx, d webhook.Delivery) error {
		applied.Add(1)
		return nil
	})
	posted, killed := make(chan struct{}), make(chan struct{})
	rc := newReceiver(t, func(i int, w http.ResponseWriter, r *http.Request) bool {
		app.ServeHTTP(w, r)
		if i == 0 {
			close(posted)
			<-killed // the response never reaches the dead relay
		}
		return true
	})
	if _, err := b.reg.Add(b.ctx, endpoints.Endpoint{ID: "ep", URL: rc.srv.URL, Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}

	child := relaytest.StartChild(t, url, nil)
	publish(t, b, event("k", 1))
	select {
	case <-posted:
	case <-time.After(time.Minute):
		t.Fatal("the child relay never posted")
	}
	child.Kill(t)
	close(killed)

	runRelay(t, b, fastSink(t, b, webhook.Config{}), relay.Config{})
	idemqtest.WaitFor(t, "the redelivery", func() bool { n, _ := pending(t, b); return n == 0 })
	hits := rc.all()
	if len(hits) != 2 || hits[0].id != hits[1].id {
		t.Fatalf("%d requests, want the same webhook-id twice", len(hits))
	}
	if applied.Load() != 1 {
		t.Fatalf("applied %d times, want once", applied.Load())
	}
}

// relayChild is the child process: a relay on the parent's database until
// it is killed (or, if the parent vanished, for at most two minutes).
func relayChild(t *testing.T, url string) {
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, pool)
	runRelay(t, b, fastSink(t, b, webhook.Config{}), relay.Config{})
	relaytest.Hang()
}
