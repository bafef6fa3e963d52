package console_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/console"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/outbox"
)

// inboxDead makes keys dead letters of scope in e's inbox, failed with
// text, through the claim protocol a consumer runs.
func (e *env) inboxDead(t *testing.T, scope, text string, keys ...string) {
	t.Helper()
	claims, err := inboxsql.New(e.pool, inboxsql.Config{Retention: time.Hour}, "console test")
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error {
		for _, k := range keys {
			if _, err := claims.DeadLetterTx(e.ctx, tx, scope, k, []byte("fp"), 5, errors.New(text)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDestructiveActionsAskFirst: a purge's first step changes nothing and
// answers a page with the rows it matches and its filter; only the second
// step, with that page's token, purges, and only the rows that had failed
// when the page counted them. A token for another group, another user or
// an altered time is not a confirmation.
func TestDestructiveActionsAskFirst(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{AllowActions: true, User: user, Password: password, Token: token})
	e.deadLettersOf(t, 3, "hooks", "HTTP 500 from ID", "mail", "smtp: mailbox full")
	groups, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{Destination: "hooks"})
	if err != nil || len(groups) != 1 {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	other, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{Destination: "mail"})
	if err != nil || len(other) != 1 {
		t.Fatalf("groups %+v, %v", other, err)
	}
	c := e.as(t, basic)
	code, page := c.post("/actions/purge-group", url.Values{"csrf": {c.csrf()}, "group": {groups[0].ID}, "return": {"/dead"}})
	if code != http.StatusOK {
		t.Fatalf("first step: %d %s", code, page)
	}
	for _, want := range []string{`<strong id="confirm-rows">3</strong>`, "deleted for good", "hooks", `id="confirm-filter"`, "error_class", `id="nav-dead"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the confirm page lacks %q:\n%s", want, page)
		}
	}
	if st, err := e.ob.Stats(e.ctx); err != nil || st.Dead != 6 {
		t.Fatalf("after the first step: %+v, %v; want the 6 dead letters untouched", st, err)
	}
	confirm := confirmForm(t, page)

	// Forged or altered confirmations: each answers the confirm page again.
	forged := map[string]url.Values{}
	for name, change := range map[string]func(url.Values){
		"another group": func(f url.Values) { f.Set("group", other[0].ID) },
		"another time":  func(f url.Values) { f.Set("confirm_at", time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)) },
		"no token":      func(f url.Values) { f.Del("confirm") },
		"wrong token":   func(f url.Values) { f.Set("confirm", strings.Repeat("0", 64)) },
	} {
		f := url.Values{}
		for k, v := range confirm {
			f[k] = v
		}
		change(f)
		forged[name] = f
	}
	tok := e.as(t, bearer)
	for name, f := range forged {
		if code, page := c.post("/actions/purge-group", f); code != http.StatusOK || !strings.Contains(page, `id="confirm"`) {
			t.Errorf("%s: %d, want the confirm page again:\n%s", name, code, page)
		}
	}
	f := url.Values{}
	for k, v := range confirm {
		f[k] = v
	}
	f.Set("csrf", tok.csrf())
	if code, page := tok.post("/actions/purge-group", f); code != http.StatusOK || !strings.Contains(page, `id="confirm"`) {
		t.Errorf("another user's confirmation: %d, want the confirm page again:\n%s", code, page)
	}
	if st, err := e.ob.Stats(e.ctx); err != nil || st.Dead != 6 {
		t.Fatalf("after forged confirmations: %+v, %v; want the 6 dead letters untouched", st, err)
	}

	// Two more dead letters of the group arrive after the page counted 3.
	e.deadLettersOf(t, 2, "hooks", "HTTP 500 from ID")
	code, loc := c.post("/actions/purge-group", confirm)
	if code != http.StatusSeeOther {
		t.Fatalf("confirmed purge: %d %s", code, loc)
	}
	if done := c.flash(loc); !strings.Contains(done, "purged 3 dead letters of group "+groups[0].ID) {
		t.Errorf("after the purge the page says %q", done)
	}
	if left, err := e.ob.DeadGroup(e.ctx, groups[0].ID); err != nil || left.Count != 2 {
		t.Errorf("group after the purge: %+v, %v; want the 2 that failed after the confirm page", left, err)
	}
}

// TestMessageAndInboxActions: a single outbox dead letter is replayed and
// another purged from its page; an inbox group is purged and another
// released, each after its confirm page; the audit log has each.
func TestMessageAndInboxActions(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{AllowActions: true, User: user, Password: password})
	ids := e.deadLettersOf(t, 2, "hooks", "HTTP 500 from ID")
	c := e.as(t, basic)
	if _, page := c.get("/dead/" + ids[0]); !strings.Contains(page, `id="message-replay"`) || !strings.Contains(page, `id="message-purge"`) {
		t.Fatalf("the message page has no replay or purge:\n%s", page)
	}
	if done := c.act("replay-message", url.Values{"id": {ids[0]}, "return": {"/dead"}}, 1); !strings.Contains(done, "replayed 1 dead letter of dead letter "+ids[0]) {
		t.Errorf("replay one: %q", done)
	}
	if done := c.act("purge-message", url.Values{"id": {ids[1]}}, 1); !strings.Contains(done, "purged 1 dead letter") {
		t.Errorf("purge one: %q", done)
	}
	if pending, err := e.ob.PendingByKey(e.ctx, "hooks-key-0", 10); err != nil || len(pending) != 1 || pending[0].ID.String() != ids[0] {
		t.Errorf("pending of hooks-key-0: %+v, %v; want the replayed message", pending, err)
	}
	if st, err := e.ob.Stats(e.ctx); err != nil || st.Dead != 0 {
		t.Errorf("dead letters after replay and purge: %+v, %v", st, err)
	}
	if done := c.act("purge-message", url.Values{"id": {ids[1]}}, -1); !strings.Contains(done, "nothing to do") {
		t.Errorf("a purged message purged again: %q", done)
	}

	e.inboxDead(t, "billing", "charge declined (SQLSTATE 23514)", "b-1", "b-2", "b-3")
	e.inboxDead(t, "mailer", "smtp: mailbox full", "m-1")
	groups, err := e.ib.DeadGroups(e.ctx, inbox.DeadFilter{})
	if err != nil || len(groups) != 2 || groups[0].Scope != "billing" {
		t.Fatalf("inbox groups %+v, %v", groups, err)
	}
	if _, page := c.get("/inbox"); !strings.Contains(page, `id="purge-inbox-`+groups[0].ID+`"`) {
		t.Fatalf("the inbox page has no purge:\n%s", page)
	}
	if done := c.act("purge-inbox-group", url.Values{"group": {groups[0].ID}, "return": {"/inbox"}}, 3); !strings.Contains(done, "purged 3 inbox dead letters") {
		t.Errorf("purge an inbox group: %q", done)
	}
	if done := c.act("release-group", url.Values{"group": {groups[1].ID}, "return": {"/inbox"}}, 1); !strings.Contains(done, "released 1 inbox dead letter") {
		t.Errorf("release an inbox group: %q", done)
	}
	if left, err := e.ib.DeadGroups(e.ctx, inbox.DeadFilter{}); err != nil || len(left) != 0 {
		t.Errorf("inbox groups after purge and release: %+v, %v", left, err)
	}
	log, err := e.ob.AuditLog(e.ctx, 0, 10)
	if err != nil || len(log) != 5 {
		t.Fatalf("audit log %+v, %v; want 5 entries", log, err)
	}
	for i, want := range []string{"inbox.release done 1", "inbox.purge done 3", "outbox.purge nothing to do 0", "outbox.purge done 1", "outbox.replay done 1"} {
		if got := fmt.Sprintf("%s %s %d", log[i].Action, log[i].Outcome, log[i].Rows); got != want || log[i].Actor != "ui:alice" {
			t.Errorf("audit entry %d: %s by %s, want %s by ui:alice", i, got, log[i].Actor, want)
		}
	}
}

// TestAuditNamesEveryAttempt: each token's holder is recorded by the
// name the operator gave it; a replay that found nothing is recorded as
// such, and so is one whose rows another operator took between the
// confirm page and the confirmation.
func TestAuditNamesEveryAttempt(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{AllowActions: true, Token: token, TokenName: "ops-bot", Tokens: map[string]string{"bob": "tok-bob", "carol": "tok-carol"}})
	e.deadLettersOf(t, 2, "hooks", "HTTP 500 from ID")
	groups, err := e.ob.DeadGroups(e.ctx, outbox.DeadFilter{})
	if err != nil || len(groups) != 1 {
		t.Fatalf("groups %+v, %v", groups, err)
	}
	as := func(tok string) *client {
		return e.as(t, func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) })
	}
	bob, carol := as("tok-bob"), as("tok-carol")
	if _, page := bob.get("/"); !strings.Contains(page, "signed in as bob") {
		t.Errorf("bob's page does not name him:\n%s", page)
	}
	form := url.Values{"group": {groups[0].ID}}
	form.Set("csrf", bob.csrf())
	_, page := bob.post("/actions/replay-group", form)
	bobsConfirm := confirmForm(t, page)
	if done := carol.act("replay-group", url.Values{"group": {groups[0].ID}}, 2); !strings.Contains(done, "replayed 2") {
		t.Fatalf("carol's replay: %q", done)
	}
	code, loc := bob.post("/actions/replay-group", bobsConfirm)
	if done := bob.flash(loc); code != http.StatusSeeOther || !strings.Contains(done, "nothing to do") {
		t.Errorf("bob's late confirmation: %d %q", code, done)
	}
	if done := as(token).act("replay-group", url.Values{"group": {"0123456789ab"}}, -1); !strings.Contains(done, "nothing to do") {
		t.Errorf("a replay of a group that does not exist: %q", done)
	}
	log, err := e.ob.AuditLog(e.ctx, 0, 10)
	if err != nil || len(log) != 3 {
		t.Fatalf("audit log %+v, %v; want 3 entries", log, err)
	}
	for i, want := range []string{"ui:ops-bot outbox.replay 0123456789ab nothing to do 0", "ui:bob outbox.replay " + groups[0].ID + " nothing to do 0",
		"ui:carol outbox.replay " + groups[0].ID + " done 2"} {
		l := log[i]
		if got := fmt.Sprintf("%s %s %s %s %d", l.Actor, l.Action, l.Target, l.Outcome, l.Rows); got != want || i == 2 && !strings.Contains(string(l.Filter), `"destination": "hooks"`) {
			t.Errorf("audit entry %d: %s %s, want %s", i, got, l.Filter, want)
		}
	}
	if _, page := carol.get("/audit"); !strings.Contains(page, "nothing to do") || !strings.Contains(page, "ui:bob") {
		t.Errorf("the audit page does not show the outcomes:\n%s", page)
	}
}

// TestFlashComesFromTheServer: a link's query cannot put text in the
// console's banners; an action's message reaches the next page only.
func TestFlashComesFromTheServer(t *testing.T) {
	t.Parallel()
	e := setup(t, console.Config{AllowActions: true, User: user, Password: password})
	c := e.as(t, basic)
	for _, path := range []string{"/?error=Database+compromised:+call+555", "/dead?done=All+clear", "/audit?error=x&done=y"} {
		code, page := c.get(path)
		if code != http.StatusOK || strings.Contains(page, "compromised") || strings.Contains(page, "All clear") || strings.Contains(page, `id="flash"`) || strings.Contains(page, `id="error"`) {
			t.Errorf("GET %s: %d, shows the query's text in a banner:\n%s", path, code, page)
		}
	}
	e.deadLettersOf(t, 1, "hooks", "HTTP 500 from ID")
	ids, err := e.ob.DeadLetters(e.ctx, outbox.DeadFilter{})
	if err != nil || len(ids) != 1 {
		t.Fatalf("dead letters %+v, %v", ids, err)
	}
	if done := c.act("replay-message", url.Values{"id": {ids[0].ID.String()}, "return": {"/audit"}}, 1); !strings.Contains(done, "replayed 1") {
		t.Errorf("flash after the replay: %q", done)
	}
	if again := c.flash("/audit"); again != "" {
		t.Errorf("the flash shows twice: %q", again)
	}
}
