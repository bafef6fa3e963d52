package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemq/idemq"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// quiet discards logs unless WEBHOOK_TEST_LOG is set.
var quiet = slog.New(slog.NewTextHandler(logOut(), nil))

func logOut() io.Writer {
	if os.Getenv("WEBHOOK_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}

// loopback lets the tests' receivers on 127.0.0.1 and ::1 through the SSRF
// guard, which refuses them by default.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	ob    *outbox.Outbox
	reg   *endpoints.Registry
	pub   *endpoints.Publisher
	inbox *inbox.Store
}

func setup(t testing.TB) bundle {
	t.Helper()
	return setupOn(t, testenv.Postgres(t))
}

func setupOn(t testing.TB, pool *pgxpool.Pool) bundle {
	t.Helper()
	ctx := context.Background()
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pub, err := endpoints.NewPublisher(reg, ob)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return bundle{ctx: ctx, pool: pool, ob: ob, reg: reg, pub: pub, inbox: in}
}

// fastSink is a Sink for tests: loopback allowed, endpoint changes seen
// within 20 ms, held rows back every 50 ms.
func fastSink(t testing.TB, b bundle, cfg webhook.Config) *webhook.Sink {
	t.Helper()
	cfg.AllowedNetworks = append(cfg.AllowedNetworks, loopback...)
	if cfg.RefreshInterval == 0 {
		cfg.RefreshInterval = 20 * time.Millisecond
	}
	if cfg.HoldInterval == 0 {
		cfg.HoldInterval = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s, err := webhook.NewSink(b.reg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// runRelay runs a relay that routes webhook rows to sink until the test
// ends; it logs to cfg.Logger when set, nowhere otherwise.
func runRelay(t testing.TB, b bundle, sink relay.Sink, cfg relay.Config) {
	t.Helper()
	router := relay.NewRouter()
	if err := router.RoutePrefix(endpoints.DestinationPrefix, sink); err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	if cfg.Retry.BaseDelay == 0 {
		cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = 10*time.Millisecond, 50*time.Millisecond
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	r, err := relay.New(b.pool, b.ob, router, cfg)
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(b.ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := running.Stop(); err != nil {
			t.Error(err)
		}
	})
}

// addEndpoint registers an endpoint for url with a fresh secret and
// returns it with the secret.
func addEndpoint(t testing.TB, b bundle, url string, tweak func(*endpoints.Endpoint)) (endpoints.Endpoint, string) {
	t.Helper()
	secret := signing.NewSecret()
	ep := endpoints.Endpoint{URL: url, Keys: []string{secret}}
	if tweak != nil {
		tweak(&ep)
	}
	ep, err := b.reg.Add(b.ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	return ep, secret
}

// publish fans events out in one transaction.
func publish(t testing.TB, b bundle, events ...endpoints.Event) int {
	t.Helper()
	var n int
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		n, err = b.pub.PublishTx(b.ctx, tx, events...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// event returns an event of type "test.event" whose data is {"n": n}.
func event(key string, n int) endpoints.Event {
	return endpoints.Event{Type: "test.event", Key: key, Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// hit is one request a receiver saw.
type hit struct {
	id     string
	header http.Header
	body   []byte
	n      int // data.n of the body
}

// receiver records every request and answers with respond (200 when nil).
type receiver struct {
	mu      sync.Mutex
	hits    []hit
	respond func(i int, w http.ResponseWriter, r *http.Request) bool // true: answered
	srv     *httptest.Server
}

func newReceiver(t testing.TB, respond func(i int, w http.ResponseWriter, r *http.Request) bool) *receiver {
	rc := &receiver{respond: respond}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body)) // for a middleware behind
	var p struct {
		Data struct{ N int } `json:"data"`
	}
	_ = json.Unmarshal(body, &p)
	rc.mu.Lock()
	i := len(rc.hits)
	rc.hits = append(rc.hits, hit{id: r.Header.Get(signing.HeaderID), header: r.Header.Clone(), body: body, n: p.Data.N})
	rc.mu.Unlock()
	if rc.respond != nil && rc.respond(i, w, r) {
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (rc *receiver) all() []hit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hit(nil), rc.hits...)
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.hits)
}

// pending counts the outbox rows not yet delivered and sums their attempts.
func pending(t testing.TB, b bundle) (rows, attempts int) {
	t.Helper()
	return pendingFor(t, b, "")
}

// pendingFor is pending for the rows of one endpoint ("": all), read from
// the outbox table of the default configuration.
func pendingFor(t testing.TB, b bundle, endpoint string) (rows, attempts int) {
	t.Helper()
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), coalesce(sum(attempts), 0) FROM idemq_outbox
WHERE $1 = '' OR destination = $2`, endpoint, endpoints.DestinationPrefix+endpoint).Scan(&rows, &attempts); err != nil {
		t.Fatal(err)
	}
	return rows, attempts
}

// newWebhookReceiver returns a Receiver verifying with secret, on a
// consumer of scope "webhook" that runs h in Redeliver mode, so a failed
// attempt answers 503 at once.
func newWebhookReceiver(t testing.TB, b bundle, secret string, h webhook.Handler) *webhook.Receiver {
	t.Helper()
	c, err := consumer.New(b.pool, "webhook", webhook.Handle(h), consumer.Config{Redeliver: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return receiverOn(t, c, secret)
}

// receiverOn returns a Receiver verifying with secret on c.
func receiverOn(t testing.TB, c *consumer.Consumer, secret string) *webhook.Receiver {
	t.Helper()
	r, err := webhook.NewReceiver(c, webhook.ReceiverConfig{Keys: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
