package console_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// TestBadInputConfig: a prefix that could take a redirect to another host
// or carry a query, and blank or ambiguous credentials, are refused.
func TestBadInputConfig(t *testing.T) {
	ob, err := outbox.New(fakeDB{}, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]console.Config{
		"prefix //evil.example":    {Outbox: ob, Prefix: "//evil.example"},
		"prefix with a query":      {Outbox: ob, Prefix: "/console?x=1"},
		"prefix with a fragment":   {Outbox: ob, Prefix: "/console#x"},
		"prefix with a backslash":  {Outbox: ob, Prefix: `/\evil.example`},
		"prefix with //":           {Outbox: ob, Prefix: "/a//b"},
		"prefix with an escape":    {Outbox: ob, Prefix: "/a%2f"},
		"prefix with a space":      {Outbox: ob, Prefix: "/a b"},
		"prefix with a newline":    {Outbox: ob, Prefix: "/a\nLocation: x"},
		"prefix http://":           {Outbox: ob, Prefix: "http://evil.example"},
		"blank token":              {Outbox: ob, DB: fakeDB{}, AllowActions: true, Token: "   "},
		"blank token, read-only":   {Outbox: ob, Token: "\t"},
		"blank user":               {Outbox: ob, User: " ", Password: "p"},
		"blank password":           {Outbox: ob, User: "u", Password: "  "},
		"token name without token": {Outbox: ob, TokenName: "bot"},
		"blank token name":         {Outbox: ob, Token: "t", TokenName: "  "},
		"blank name in Tokens":     {Outbox: ob, Tokens: map[string]string{" ": "t"}},
		"blank token in Tokens":    {Outbox: ob, DB: fakeDB{}, AllowActions: true, Tokens: map[string]string{"bob": "  "}},
		"empty token in Tokens":    {Outbox: ob, Tokens: map[string]string{"bob": ""}},
		"a token given twice":      {Outbox: ob, Token: "t", Tokens: map[string]string{"bob": "t"}},
		"two names, one token":     {Outbox: ob, Tokens: map[string]string{"bob": "t", "carol": "t"}},
	} {
		if _, err := console.NewHandler(cfg); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("%s: NewHandler: %v, want idemq.ErrConfig", name, err)
		}
	}
	if _, err := console.NewHandler(console.Config{Outbox: ob, Prefix: "/ops/console-1"}); err != nil {
		t.Errorf("prefix /ops/console-1: %v", err)
	}
}

// TestBadInputRequests: a query or form value with a NUL byte or invalid
// UTF-8, a blank filter, a filter that is not a time, and an action whose
// field is missing, empty or blank get a 400 page in the console's layout
// (its navigation, not a raw SQLSTATE); an empty filter field is dropped
// by a redirect, never read as a filter; nothing changes.
func TestBadInputRequests(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{AllowActions: true, User: user, Password: password})
	e.deadLettersOf(t, 2, "hooks", "HTTP 500 from ID")
	e.inboxDead(t, "billing", "declined", "b-1")
	c := e.as(t, basic)
	for _, path := range []string{
		"/dead?destination=%00", "/dead?class=%ff", "/dead?key_prefix=a%00b", "/lookup?key=%00", "/lookup?key=%ff%fe",
		"/inbox?scope=%ff", "/audit?before=%00", "/?x=%ff", "/dead?%ff=1",
		"/dead?destination=+", "/dead?class=%20%20", "/dead?since=yesterday", "/dead?until=12", "/dead?group=+",
		"/dead?group=abc&after=not-a-uuid", "/inbox?scope=%20", "/audit?before=x", "/audit?before=-4",
		"/dead/not-a-uuid",
	} {
		code, body := c.get(path)
		if code != http.StatusBadRequest || !strings.Contains(body, `id="nav-overview"`) || strings.Contains(body, "SQLSTATE") {
			t.Errorf("GET %s: %d, want a 400 page in the layout:\n%s", path, code, body)
		}
	}
	for _, path := range []string{"/dead?destination=&class=&key_prefix=&since=&until=", "/inbox?scope="} {
		code, loc := c.get(path)
		if code != http.StatusSeeOther || strings.Contains(loc, "=") {
			t.Errorf("GET %s: %d %s, want a redirect without the empty fields", path, code, loc)
		}
	}
	groups, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 1 {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	for _, a := range []struct {
		action string
		form   url.Values
	}{
		{"purge-group", url.Values{}},
		{"purge-group", url.Values{"group": {""}}},
		{"purge-group", url.Values{"group": {"   "}}},
		{"purge-group", url.Values{"group": {"zzzzzzzzzzzz"}}},
		{"purge-group", url.Values{"group": {groups[0].ID[:6]}}},
		{"purge-group", url.Values{"group": {groups[0].ID, groups[0].ID}}},
		{"replay-group", url.Values{"group": {""}}},
		{"replay-since", url.Values{"since": {""}, "all_destinations": {"on"}}},
		{"replay-since", url.Values{"since": {"2020-01-01T00:00"}, "destination": {""}}},
		{"replay-since", url.Values{"since": {"2020-01-01T00:00"}, "destination": {"  "}}},
		{"replay-since", url.Values{"since": {"2020-01-01T00:00"}}},
		{"replay-since", url.Values{"since": {"2020-01-01T00:00"}, "destination": {"hooks"}, "all_destinations": {"on"}}},
		{"replay-since", url.Values{"since": {"2020-01-01T00:00"}, "all_destinations": {"yes"}}},
		{"replay-since", url.Values{"since": {"2999-01-01T00:00"}, "all_destinations": {"on"}}},
		{"replay-since", url.Values{"since": {"yesterday"}, "all_destinations": {"on"}}},
		{"replay-message", url.Values{"id": {""}}},
		{"purge-message", url.Values{"id": {"not-a-uuid"}}},
		{"release-group", url.Values{"group": {""}}},
		{"purge-inbox-group", url.Values{"group": {" "}}},
		{"enable-endpoint", url.Values{"endpoint": {""}}},
		{"purge-group", url.Values{"group": {"a\x00b"}}},
		{"purge-group", url.Values{"group": {"\xff"}}},
	} {
		f := url.Values{"csrf": {c.csrf()}}
		for k, v := range a.form {
			f[k] = v
		}
		code, body := c.post("/actions/"+a.action, f)
		if code != http.StatusBadRequest || !strings.Contains(body, `id="nav-overview"`) {
			t.Errorf("POST %s %v: %d, want a 400 page in the layout:\n%s", a.action, a.form, code, body)
		}
	}
	if code, body := c.post("/actions/drop-tables", url.Values{"csrf": {c.csrf()}}); code != http.StatusNotFound || !strings.Contains(body, `id="nav-overview"`) {
		t.Errorf("an unknown action: %d\n%s", code, body)
	}
	if code, body := c.get("/no-such-page"); code != http.StatusNotFound || !strings.Contains(body, `id="nav-overview"`) {
		t.Errorf("an unknown page: %d\n%s", code, body)
	}
	if st, err := e.ob.Stats(e.ctx); err != nil || st.Dead != 2 || st.Pending != 0 {
		t.Errorf("after bad input: %+v, %v; want the 2 dead letters untouched", st, err)
	}
	if g, err := e.ib.DeadGroups(e.ctx, inbox.DeadFilter{}); err != nil || len(g) != 1 {
		t.Errorf("inbox after bad input: %+v, %v", g, err)
	}
	if log, err := e.ob.AuditLog(e.ctx, 0, 10); err != nil || len(log) != 0 {
		t.Errorf("audit log after bad input: %+v, %v; want nothing acted on", log, err)
	}
}

// TestBadInputUnmigrated: a console on a database whose stores were never
// migrated answers each page with what is missing and the command that
// creates it, in its layout, instead of a raw 42P01.
func TestBadInputUnmigrated(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := endpoints.NewRegistry(pool, endpoints.RegistryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := console.NewHandler(console.Config{Outbox: ob, Inbox: ib, Webhooks: reg})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/dead", "/dead?group=0123456789ab", "/dead/0192f3a4-5b6c-7d8e-9f01-23456789abcd", "/inbox", "/webhooks", "/lookup?key=k", "/audit"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		body := rec.Body.String()
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(body, "idemq migrate --components outbox,inbox,webhook") ||
			!strings.Contains(body, "does not exist") || !strings.Contains(body, `id="nav-overview"`) || strings.Contains(body, "SQLSTATE") {
			t.Errorf("GET %s on an unmigrated database: %d\n%s", path, rec.Code, body)
		}
	}
}
