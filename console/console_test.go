package console_test

import (
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// TestNewHandlerValidates: a console without an outbox, with half of basic
// auth, or with actions and nobody to authenticate is refused.
func TestNewHandlerValidates(t *testing.T) {
	ob, err := outbox.New(fakeDB{}, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []console.Config{
		{},
		{Outbox: ob, User: "a"},
		{Outbox: ob, AllowActions: true, Token: "t"},
		{Outbox: ob, AllowActions: true, DB: fakeDB{}},
		{Outbox: ob, Prefix: "console/"},
	} {
		if _, err := console.NewHandler(cfg); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("NewHandler(%+v): %v, want idemq.ErrConfig", cfg, err)
		}
	}
}

// secret is a webhook signing key.
const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// fakeDB is a non-nil DB the validation sees.
type fakeDB struct{ outbox.DB }

// deadLettersOf runs a relay whose sink refuses each destination with its
// cause (pairs dest, cause) until n messages of each are dead letters, and
// returns their ids, destination by destination.
func (e *env) deadLettersOf(t *testing.T, n int, pairs ...string) []string {
	t.Helper()
	s := &sink{failing: map[string]string{}}
	for i := 0; i+1 < len(pairs); i += 2 {
		s.failing[pairs[i]] = pairs[i+1]
	}
	dead, stop := e.runRelay(t, s)
	defer stop()
	var ids []string
	for i := 0; i+1 < len(pairs); i += 2 {
		ids = append(ids, e.enqueue(t, pairs[i], n)...)
	}
	waitFor(t, "the dead letters", func() bool { return dead.Load() >= int64(n*len(pairs)/2) })
	return ids
}

// TestPagesRender: every page renders real data from the database: the
// overview's backlog and relays, the dead-letter groups and one message,
// the inbox's groups and conflicts, webhook endpoints, a key's lookup and
// the audit log.
func TestPagesRender(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{User: user, Password: password})
	ids := e.deadLettersOf(t, 3, "hooks", "webhook: endpoint ep-1: HTTP 503: busy, message ID")
	if err := e.ob.Enqueue(e.ctx, outbox.Message{Destination: "orders", Key: "order-9", Payload: []byte(`{"n":9}`)}); err != nil {
		t.Fatal(err)
	}
	// The claim protocol package consumer runs, on the inbox's table.
	claims := (*inboxsql.Store)(e.ib)
	err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := claims.DeadLetterTx(e.ctx, tx, "billing", "order-9", []byte("fp"), 5, errors.New("charge declined (SQLSTATE 23514)")); err != nil {
			return err
		}
		return claims.RecordConflictTx(e.ctx, tx, "billing", "order-8", []byte("other"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.webhooks.Add(e.ctx, endpoints.Endpoint{ID: "ep-1", URL: "https://hooks.example/in", Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}
	if err := e.webhooks.Disable(e.ctx, "ep-1", "410 Gone"); err != nil {
		t.Fatal(err)
	}
	// ep-2's breaker as a relay's webhook Sink records it (tested in
	// transports/webhook): open for a minute, by relay-a.
	if _, err := e.webhooks.Add(e.ctx, endpoints.Endpoint{ID: "ep-2", URL: "https://hooks.example/two", Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE idemq_webhook_endpoints SET breaker_state = 'open', breaker_since = now() - interval '1 minute',
		breaker_relay = 'relay-a' WHERE id = 'ep-2'`); err != nil {
		t.Fatal(err)
	}
	groups, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 1 {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	c := e.as(t, basic)
	for _, p := range []struct{ path, want string }{
		{"/", `id="destinations"`},
		{"/", "orders"},
		{"/", "hooks"}, // failed in the last hour, no backlog
		{"/dead", "http 5xx: permanent: webhook: endpoint ep-<n>: HTTP <n>: busy, message <uuid>"},
		{"/dead", groups[0].ID},
		{"/dead?group=" + groups[0].ID, ids[0]},
		{"/dead?destination=nope", `id="no-groups"`},
		{"/dead/" + ids[0], "&#34;order&#34;: 0"},
		{"/dead/" + ids[0], "tenant"},
		{"/inbox", "sqlstate 23514: charge declined"},
		{"/inbox", "order-8"},
		{"/webhooks", "410 Gone"},
		{"/webhooks", `id="breaker-note"`},
		{"/webhooks", `<span class="bad" data-breaker="open">open</span> since `},
		{"/webhooks", ` ago) by <span class="mono">relay-a</span>`},
		{"/lookup?key=order-9", `id="lookup-inbox"`},
		{"/lookup?key=order-9", `id="pending"`},
		{"/lookup?key=" + ids[1], `id="lookup-dead"`},
		{"/audit", `id="no-audit"`},
		{"/static/style.css", "--accent"},
	} {
		code, body := c.get(p.path)
		if code != http.StatusOK || !strings.Contains(body, p.want) && !strings.Contains(body, html.EscapeString(p.want)) {
			t.Errorf("GET %s: %d, want 200 with %q:\n%s", p.path, code, p.want, body)
		}
		if strings.Contains(body, `name="csrf"`) {
			t.Errorf("GET %s of a read-only console shows action forms", p.path)
		}
	}
	// An open breaker lists its endpoint with the failing ones, though its
	// failure clock is not running.
	if _, body := c.get("/webhooks"); !regexp.MustCompile(`(?s)id="failing".*ep-2.*<h2>Healthy</h2>`).MatchString(body) {
		t.Errorf("GET /webhooks: ep-2, whose breaker is open, is not listed as failing:\n%s", body)
	}
	if code, _ := c.get("/dead/" + "0192f3a4-5b6c-7d8e-9f01-23456789abcd"); code != http.StatusNotFound {
		t.Errorf("an unknown message: %d, want 404", code)
	}
}

// TestActionsRefused: a read-only console refuses actions; with actions on,
// no user, a wrong user, a missing or another user's CSRF token, or a
// cross-site request are refused too; nothing changes.
func TestActionsRefused(t *testing.T) {
	t.Parallel()
	ro := setup(t, console.Config{User: user, Password: password})
	ro.deadLettersOf(t, 2, "hooks", "refused")
	groups, _ := ro.ob.DeadGroups(ro.ctx, outbox.DeadFilter{})
	form := url.Values{"group": {groups[0].ID}, "return": {"/dead"}}
	if code, body := ro.as(t, basic).post("/actions/replay-group", form); code != http.StatusForbidden || !strings.Contains(body, "read-only") {
		t.Errorf("replay on a read-only console: %d %s", code, body)
	}

	e := setup(t, console.Config{AllowActions: true, User: user, Password: password, Token: token})
	e.deadLettersOf(t, 2, "hooks", "refused")
	groups, _ = e.ob.DeadGroups(e.ctx, outbox.DeadFilter{})
	form = url.Values{"group": {groups[0].ID}, "return": {"/dead"}}
	wrong := func(r *http.Request) { r.SetBasicAuth(user, "guess") }
	for _, c := range []struct {
		name  string
		c     *client
		csrf  string
		extra func(*http.Request)
		want  int
	}{
		{"nobody", e.as(t, nobody), "", nil, http.StatusUnauthorized},
		{"wrong password", e.as(t, wrong), "", nil, http.StatusUnauthorized},
		{"no CSRF token", e.as(t, basic), "", nil, http.StatusForbidden},
		{"another user's CSRF token", e.as(t, basic), e.as(t, bearer).csrf(), nil, http.StatusForbidden},
		{"cross-site", e.as(t, basic), e.as(t, basic).csrf(), func(r *http.Request) { r.Header.Set("Sec-Fetch-Site", "cross-site") }, http.StatusForbidden},
		{"another origin", e.as(t, basic), e.as(t, basic).csrf(), func(r *http.Request) {
			r.Header.Del("Sec-Fetch-Site")
			r.Header.Set("Origin", "https://evil.example")
		}, http.StatusForbidden},
	} {
		f := url.Values{}
		for k, v := range form {
			f[k] = v
		}
		if c.csrf != "" {
			f.Set("csrf", c.csrf)
		}
		var extra []func(*http.Request)
		if c.extra != nil {
			extra = append(extra, c.extra)
		}
		if code, body := c.c.post("/actions/replay-group", f, extra...); code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
		}
	}
	if st, err := e.ob.Stats(e.ctx); err != nil || st.Dead != 2 || st.Pending != 0 {
		t.Errorf("after refused actions: %+v, %v; want the 2 dead letters untouched", st, err)
	}
	if log, err := e.ob.AuditLog(e.ctx, 0, 10); err != nil || len(log) != 0 {
		t.Errorf("audit log %+v, %v; want empty", log, err)
	}
}

// TestReplayGroupIsAuditedAndIdempotent: an authenticated user replays a
// group from the page: its messages are back in the outbox with their ids
// and the audit log says who, what and how many; a second replay of the
// group changes nothing. A purge of another group and an endpoint's enable
// are audited too. A token works as well as basic auth, through the
// login page's cookie too.
func TestReplayGroupIsAuditedAndIdempotent(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{AllowActions: true, User: user, Password: password, Token: token})
	ids := e.deadLettersOf(t, 3, "hooks", "HTTP 500 from ID", "mail", "smtp: mailbox full")[:3]
	// ep-2's breaker as a relay's webhook Sink records it (tested in
	// transports/webhook): open for a minute, by relay-a.
	if _, err := e.webhooks.Add(e.ctx, endpoints.Endpoint{ID: "ep-2", URL: "https://hooks.example/two", Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE idemq_webhook_endpoints SET breaker_state = 'open', breaker_since = now() - interval '1 minute',
		breaker_relay = 'relay-a' WHERE id = 'ep-2'`); err != nil {
		t.Fatal(err)
	}
	groups, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 2 || groups[0].Destination != "hooks" {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	c := e.as(t, basic)
	form := url.Values{"group": {groups[0].ID}, "return": {"/dead"}}
	if done := c.act("replay-group", form, 3); !strings.Contains(done, "replayed 3 dead letters") {
		t.Fatalf("replay: %q", done)
	}
	pending := func() []string {
		var out []string
		for i := range 3 {
			got, err := e.ob.PendingByKey(e.ctx, "hooks-key-"+string(rune('0'+i)), 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range got {
				out = append(out, m.ID.String())
			}
		}
		return out
	}
	if got := pending(); strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("pending after replay %v, want the original ids %v", got, ids)
	}
	if done := c.act("replay-group", form, 0); !strings.Contains(done, "nothing to do") || len(pending()) != 3 {
		t.Fatalf("second replay: %q, %d pending; want nothing done", done, len(pending()))
	}

	tok := e.as(t, bearer)
	if done := tok.act("purge-group", url.Values{"group": {groups[1].ID}}, 3); !strings.Contains(done, "purged 3 dead letters") {
		t.Fatalf("purge with a token: %q", done)
	}
	if _, err := e.webhooks.Add(e.ctx, endpoints.Endpoint{ID: "ep", URL: "https://hooks.example/in", Keys: []string{secret}}); err != nil {
		t.Fatal(err)
	}
	if err := e.webhooks.Disable(e.ctx, "ep", "410 Gone"); err != nil {
		t.Fatal(err)
	}
	if done := c.act("enable-endpoint", url.Values{"endpoint": {"ep"}, "return": {"/webhooks"}}, -1); done != "enabled endpoint ep" {
		t.Fatalf("enable: %q", done)
	}
	if ep, err := e.webhooks.Get(e.ctx, "ep"); err != nil || !ep.DisabledAt.IsZero() {
		t.Fatalf("endpoint after enable: %+v, %v", ep, err)
	}

	log, err := e.ob.AuditLog(e.ctx, 0, 10)
	if err != nil || len(log) != 4 {
		t.Fatalf("audit log %+v, %v; want replay, the replay that found nothing, purge, enable", log, err)
	}
	if l := log[3]; l.Actor != "ui:alice" || l.Action != "outbox.replay" || l.Rows != 3 || l.Outcome != "done" || l.Target != groups[0].ID || !strings.Contains(string(l.Filter), `"destination": "hooks"`) {
		t.Errorf("replay entry %+v", l)
	}
	if l := log[2]; l.Actor != "ui:alice" || l.Action != "outbox.replay" || l.Rows != 0 || l.Outcome != "nothing to do" || l.Target != groups[0].ID {
		t.Errorf("the second replay's entry %+v", l)
	}
	if l := log[1]; l.Actor != "ui:token" || l.Action != "outbox.purge" || l.Rows != 3 {
		t.Errorf("purge entry %+v", l)
	}
	if l := log[0]; l.Action != "webhook.enable" || l.Target != "ep" {
		t.Errorf("enable entry %+v", l)
	}
	if code, body := c.get("/audit"); code != http.StatusOK || !strings.Contains(body, "outbox.replay") || !strings.Contains(body, "ui:alice") {
		t.Errorf("audit page: %d\n%s", code, body)
	}

	// A browser with the token: the login page sets the cookie.
	if code, loc := e.as(t, nobody).get("/"); code != http.StatusSeeOther || loc != "/login" {
		t.Errorf("GET / without auth: %d %s, want the login page", code, loc)
	}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/login", strings.NewReader("token="+token))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].HttpOnly {
		t.Fatalf("login: %d %+v", resp.StatusCode, cookies)
	}
	withCookie := e.as(t, func(r *http.Request) { r.AddCookie(cookies[0]) })
	if code, body := withCookie.get("/"); code != http.StatusOK || !strings.Contains(body, "signed in as token") {
		t.Errorf("GET / with the cookie: %d", code)
	}
}

// TestInboxExpiredLeases: the inbox page shows, per scope, the claims
// whose holder's lease ran out while in progress: how many, the oldest
// expiry, and a sample key with its owner and fencing token; a live lease
// is not shown, and the scope filter applies.
func TestInboxExpiredLeases(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{User: user, Password: password})
	c := e.as(t, basic)
	if code, body := c.get("/inbox"); code != http.StatusOK || !strings.Contains(body, "No expired leases.") {
		t.Fatalf("GET /inbox on an empty inbox: %d\n%s", code, body)
	}
	stuck, err := e.ib.Acquire(e.ctx, "mailer", "email-stuck", []byte("fp"), "worker-dead", time.Minute)
	if err != nil || !stuck.New {
		t.Fatalf("Acquire = %+v, %v", stuck, err)
	}
	if _, err := e.ib.Acquire(e.ctx, "mailer", "email-live", []byte("fp"), "worker-live", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(e.ctx, `UPDATE idemq_inbox SET lease_until = now() - interval '5 minutes' WHERE key_text = 'email-stuck'`); err != nil {
		t.Fatal(err)
	}
	code, body := c.get("/inbox")
	if code != http.StatusOK {
		t.Fatalf("GET /inbox: %d\n%s", code, body)
	}
	for _, want := range []string{`id="expired-leases"`, "email-stuck", "worker-dead", fmt.Sprint(stuck.Lease.Token), "5 min"} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /inbox lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "email-live") || strings.Contains(body, "worker-live") {
		t.Errorf("GET /inbox shows a live lease:\n%s", body)
	}
	if _, body := c.get("/inbox?scope=billing"); !strings.Contains(body, "No expired leases.") {
		t.Errorf("GET /inbox?scope=billing shows mailer's leases:\n%s", body)
	}
}

// TestOverviewRates: with a relay draining, the overview's second look
// shows the enqueue and drain rates from its two observations (every row
// left: drained equals enqueued) and the failing destination's dead
// letters per minute (10 in the 5-minute window: 2.0).
func TestOverviewRates(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{User: user, Password: password})
	c := e.as(t, basic)
	if code, body := c.get("/"); code != http.StatusOK || !strings.Contains(body, `id="enqueued-rate">-<`) || !strings.Contains(body, "Rates appear on the next refresh") {
		t.Fatalf("GET / first: %d, want no rate yet:\n%s", code, body)
	}
	s := &sink{failing: map[string]string{"hooks": "refused"}}
	e.enqueue(t, "orders", 40)
	e.enqueue(t, "hooks", 10)
	dead, stop := e.runRelay(t, s)
	waitFor(t, "the relay to drain the outbox", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.published) == 40 && dead.Load() == 10
	})
	stop()
	code, body := c.get("/")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", code, body)
	}
	enq, drained := between(body, `id="enqueued-rate">`, "<"), between(body, `id="drained-rate">`, "<")
	if enq == "-" || enq == "" || enq == "0.0" || drained != enq {
		t.Errorf("enqueued/min %q, drained/min %q: want the same positive rate\n%s", enq, drained, body)
	}
	if !strings.Contains(body, "Rates over the last") {
		t.Errorf("no rates note:\n%s", body)
	}
	row := between(body, `dead?destination=hooks">hooks</a>`, "</tr>")
	if !strings.Contains(row, `<td class="n bad">2.0</td>`) {
		t.Errorf("hooks row %q: want 2.0 dead letters per minute", row)
	}
}

// between returns the text of s after the first from and before the next
// to, or "".
func between(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	out, _, _ := strings.Cut(rest, to)
	return out
}
