package console_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// env is a database with every store migrated, and a console on it.
type env struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	ob       *outbox.Outbox
	ib       *inbox.Store
	webhooks *endpoints.Registry
	srv      *httptest.Server
}

const (
	user, password = "alice", "s3cret"
	token          = "tok-123"
)

// setup migrates the stores and serves a console with cfg (stores and DB
// filled in).
func setup(t *testing.T, cfg console.Config) *env {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	e := &env{ctx: ctx, pool: pool}
	var err error
	if e.ob, err = outbox.New(pool, outbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if e.ib, err = inbox.New(pool, inbox.Config{}); err != nil {
		t.Fatal(err)
	}
	if e.webhooks, err = endpoints.NewRegistry(pool, endpoints.RegistryConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []interface{ Migrate(context.Context) error }{e.ob, e.ib, e.webhooks} {
		if err := m.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cfg.DB, cfg.Outbox, cfg.Inbox, cfg.Webhooks = pool, e.ob, e.ib, e.webhooks
	h, err := console.NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	return e
}

// sink fails every message of the destinations in failing with a
// permanent error and records the ids it published.
type sink struct {
	mu        sync.Mutex
	failing   map[string]string // destination -> error text
	published []string
}

func (s *sink) Publish(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range batch {
		if msg, ok := s.failing[m.Destination]; ok {
			return idemq.Permanent(errors.New(strings.ReplaceAll(msg, "ID", m.ID.String())))
		}
	}
	for _, m := range batch {
		s.published = append(s.published, m.ID.String())
	}
	return nil
}

func (s *sink) heal(dest string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failing, dest)
}

// runRelay starts a relay on e's outbox into s until stop (or the test's
// end); it counts the dead letters it buried.
func (e *env) runRelay(t *testing.T, s *sink) (dead *atomic.Int64, stop func()) {
	t.Helper()
	dead = new(atomic.Int64)
	r, err := relay.New(e.pool, e.ob, s, relay.Config{
		BatchSize: 1, Hooks: relay.Hooks{OnDeadLettered: func(relay.DeadLetteredEvent) { dead.Add(1) }}})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(e.ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := running.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return dead, stop
}

// enqueue puts n messages on dest, with keys key-0, key-1, ...
func (e *env) enqueue(t *testing.T, dest string, n int) []string {
	t.Helper()
	var ids []string
	var msgs []outbox.Message
	for i := range n {
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: fmt.Sprintf("%s-key-%d", dest, i),
			Payload: fmt.Appendf(nil, `{"order":%d}`, i), Headers: map[string]string{"tenant": "acme"}}
		msgs, ids = append(msgs, m), append(ids, m.ID.String())
	}
	if err := e.ob.Enqueue(e.ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitFor waits for cond through idemqtest.WaitFor, allowing 30 s: the
// machine may be busy.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	idemqtest.WaitFor(t, what, cond, idemqtest.Within(30*time.Second))
}

// client makes requests to the console as someone, keeping the cookies
// the console sets (the flash message).
type client struct {
	t    *testing.T
	base string
	auth func(*http.Request)
	jar  http.CookieJar
}

func (e *env) as(t *testing.T, auth func(*http.Request)) *client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &client{t: t, base: e.srv.URL, auth: auth, jar: jar}
}

func basic(r *http.Request)  { r.SetBasicAuth(user, password) }
func bearer(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }
func nobody(*http.Request)   {}

// get returns the status and body of path.
func (c *client) get(path string) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
	c.auth(req)
	return c.do(req)
}

// post posts form to path, as a browser on the console's page does (same
// origin), and returns the status and body, redirects not followed.
func (c *client) post(path string, form url.Values, extra ...func(*http.Request)) (int, string) {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", c.base)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	c.auth(req)
	for _, f := range extra {
		f(req)
	}
	return c.do(req)
}

func (c *client) do(req *http.Request) (int, string) {
	c.t.Helper()
	hc := &http.Client{Jar: c.jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if loc := resp.Header.Get("Location"); loc != "" {
		return resp.StatusCode, loc
	}
	return resp.StatusCode, string(body)
}

var (
	csrfField   = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)
	hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)
	flashDiv    = regexp.MustCompile(`<div class="(flash|error)" id="(?:flash|error)">([^<]*)</div>`)
)

// confirmForm reads the hidden fields of a confirm page's form.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	if !strings.Contains(page, `id="confirm"`) {
		t.Fatalf("not a confirm page:\n%s", page)
	}
	form := url.Values{}
	for _, m := range hiddenField.FindAllStringSubmatch(page, -1) {
		form.Set(m[1], html.UnescapeString(m[2]))
	}
	return form
}

// act posts form to action: the first step answers the confirm page,
// which act checks says rows (when rows >= 0), and the second confirms;
// it returns the flash message of the page the action redirects to
// ("error: …" for a red one).
func (c *client) act(action string, form url.Values, rows int) string {
	c.t.Helper()
	form.Set("csrf", c.csrf())
	code, page := c.post("/actions/"+action, form)
	if code == http.StatusOK {
		if rows >= 0 && !strings.Contains(page, fmt.Sprintf(`<strong id="confirm-rows">%s</strong>`, num(rows))) {
			c.t.Fatalf("%s: the confirm page does not say %d rows:\n%s", action, rows, page)
		}
		code, page = c.post("/actions/"+action, confirmForm(c.t, page))
	}
	if code != http.StatusSeeOther {
		c.t.Fatalf("%s: %d, want a redirect:\n%s", action, code, page)
	}
	return c.flash(page)
}

// flash returns the flash message the page at path shows ("error: …" for
// a red one, "" for none).
func (c *client) flash(path string) string {
	c.t.Helper()
	code, body := c.get(path)
	if code != http.StatusOK {
		c.t.Fatalf("GET %s: %d\n%s", path, code, body)
	}
	m := flashDiv.FindStringSubmatch(body)
	switch {
	case m == nil:
		return ""
	case m[1] == "error":
		return "error: " + html.UnescapeString(m[2])
	}
	return html.UnescapeString(m[2])
}

// num writes n with thousands separators, as the console does.
func num(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// csrf reads the CSRF token from the dead-letters page.
func (c *client) csrf() string {
	c.t.Helper()
	code, body := c.get("/dead")
	m := csrfField.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		c.t.Fatalf("no CSRF token on /dead (%d):\n%s", code, body)
	}
	return m[1]
}
