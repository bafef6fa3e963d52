package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
)

// An action runs in two steps when it replays, releases or purges: the
// first POST computes what it will do (the rows it matches now, its
// filter) and answers a page that says so, with a form that repeats the
// action's fields, the time of that count and a confirm token (an HMAC of
// the user, the action, its fields and the time); only a second POST with
// that token acts. The action then covers the rows that had failed by the
// time of the count, never those that failed after the operator looked.
// Every action a user confirmed (or that matched nothing) is written to
// the audit log with its outcome: done, nothing to do, or failed.

// confirmTTL is how long a confirm page's token stays good.
const confirmTTL = 10 * time.Minute

// actionFields are the form fields of each action, the fields its confirm
// token covers.
var actionFields = map[string][]string{
	"replay-group":      {"group"},
	"purge-group":       {"group"},
	"replay-since":      {"since", "destination", "all_destinations"},
	"replay-message":    {"id"},
	"purge-message":     {"id"},
	"release-group":     {"group"},
	"purge-inbox-group": {"group"},
	"enable-endpoint":   {"endpoint"},
}

// plan is what an action will do, read before it runs.
type plan struct {
	// audit is the audit entry's action, target and filter.
	audit outbox.AuditEntry
	// what says what the action does, for the confirm page: "Purge the
	// dead letters of group …".
	what string
	// rows is how many rows it matches now; warning says what cannot be
	// undone, for the confirm page ("" for none).
	rows    int64
	warning string
	// confirm is false for an action that takes no second step.
	confirm bool
	// run acts in tx and returns the rows changed; done says what it did.
	run  func(ctx context.Context, tx pgx.Tx) (int64, error)
	done func(n int64) string
}

// badInput is an action's form that cannot be acted on: a 400.
type badInput struct{ msg string }

func (e badInput) Error() string { return e.msg }

// act runs one action. It refuses it with 403 unless actions are allowed
// and the user is authenticated, and unless the form's CSRF token is the
// user's; a form with a missing, empty or blank field gets a 400. A
// destructive action without a valid confirm token answers the confirm
// page; with one it runs, with its audit entry in one transaction, and
// redirects back (post/redirect/get) with what it did in a signed flash
// cookie.
func (h *handler) act(w http.ResponseWriter, r *http.Request) {
	user := h.user(r)
	switch {
	case !h.cfg.AllowActions:
		h.problem(w, r, http.StatusForbidden, "Read-only console", "Actions are off (Config.AllowActions, idemq ui --allow-actions): this console is read-only.")
		return
	case user == "":
		h.problem(w, r, http.StatusForbidden, "Not signed in", "Actions need an authenticated user.")
		return
	case !equal(r.PostFormValue("csrf"), h.csrfToken(user)):
		h.problem(w, r, http.StatusForbidden, "Form expired", "Missing or wrong CSRF token: reload the page and try again.")
		return
	}
	action := r.PathValue("action")
	names, ok := actionFields[action]
	if !ok {
		h.problem(w, r, http.StatusNotFound, "No such action", "The console has no action "+action+".")
		return
	}
	ctx := r.Context()
	actor := "ui:" + user
	back := backTo(r.PostFormValue("return"))
	fields, err := formFields(r, names)
	var p plan
	at, confirmed := h.confirmed(r, user, action, fields)
	if err == nil && !confirmed {
		at, err = h.countBefore(ctx)
	}
	if err == nil {
		p, err = h.plan(ctx, action, fields, at)
	}
	var bad badInput
	switch {
	case errors.As(err, &bad):
		h.problem(w, r, http.StatusBadRequest, "Bad request", bad.msg)
		return
	case err != nil:
		h.fail(w, r, err)
		return
	}
	var f flash
	switch {
	case p.rows == 0:
		p.audit.Outcome = "nothing to do"
		f.Done = "nothing to do: " + p.what + " matches no row now"
		err = h.record(ctx, actor, p.audit)
	case p.confirm && !confirmed:
		h.confirmPage(w, r, user, action, fields, p, at, back)
		return
	default:
		var n int64
		n, err = h.runPlan(ctx, actor, p)
		f.Done = p.done(n)
	}
	if err != nil {
		h.log.ErrorContext(ctx, "console: action failed", "action", action, "user", user, "err", err)
		f = flash{Error: fmt.Sprintf("%s failed: %v", action, err)}
	} else {
		h.log.InfoContext(ctx, "console: action", "action", action, "user", user, "done", f.Done)
	}
	h.setFlash(w, r, user, f)
	http.Redirect(w, r, h.cfg.Prefix+back, http.StatusSeeOther)
}

// formFields reads the action's fields from r's form. A field sent empty
// or blank is refused: read as unset it could select everything.
func formFields(r *http.Request, names []string) (map[string]string, error) {
	fields := map[string]string{}
	for _, name := range names {
		vs, ok := r.PostForm[name]
		if !ok {
			continue
		}
		if len(vs) != 1 || strings.TrimSpace(vs[0]) == "" {
			return nil, badInput{fmt.Sprintf("%s: want one non-blank value, got %q: an empty field is never read as \"all\"", name, vs)}
		}
		fields[name] = strings.TrimSpace(vs[0])
	}
	return fields, nil
}

// runPlan runs p and its audit entry in one transaction; when it fails,
// the failure is audited in a transaction of its own.
func (h *handler) runPlan(ctx context.Context, actor string, p plan) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, h.cfg.DB, func(tx pgx.Tx) error {
		var err error
		if n, err = p.run(ctx, tx); err != nil {
			return err
		}
		e := p.audit
		e.Actor, e.Rows, e.Outcome = actor, n, "done"
		if n == 0 {
			e.Outcome = "nothing to do"
		}
		return h.cfg.Outbox.RecordAuditTx(ctx, tx, e)
	})
	if err != nil {
		e := p.audit
		e.Outcome = "failed: " + err.Error()
		if aerr := h.record(ctx, actor, e); aerr != nil {
			err = fmt.Errorf("%w (and the audit log failed: %v)", err, aerr)
		}
	}
	return n, err
}

// record writes audit entry e of actor in a transaction of its own.
func (h *handler) record(ctx context.Context, actor string, e outbox.AuditEntry) error {
	e.Actor = actor
	return pgx.BeginFunc(ctx, h.cfg.DB, func(tx pgx.Tx) error { return h.cfg.Outbox.RecordAuditTx(ctx, tx, e) })
}

// plan reads what action will do with fields, on the rows that had
// failed by at.
func (h *handler) plan(ctx context.Context, action string, fields map[string]string, at time.Time) (plan, error) {
	switch action {
	case "replay-group", "purge-group":
		return h.planOutboxGroup(ctx, fields, action == "purge-group", at)
	case "replay-since":
		return h.planReplaySince(ctx, fields, at)
	case "replay-message", "purge-message":
		return h.planMessage(ctx, fields, action == "purge-message")
	case "release-group", "purge-inbox-group":
		return h.planInboxGroup(ctx, fields, action == "purge-inbox-group", at)
	default: // enable-endpoint
		return h.planEnable(ctx, fields)
	}
}

// require returns fields[name] or a badInput saying it is missing.
func require(fields map[string]string, name string) (string, error) {
	v, ok := fields[name]
	if !ok {
		return "", badInput{name + ": missing"}
	}
	return v, nil
}

// groupID reads the group field: the 12 hex digits of a group's ID.
func groupID(fields map[string]string) (string, error) {
	id, err := require(fields, "group")
	if err != nil {
		return "", err
	}
	if len(id) != 12 || strings.Trim(strings.ToLower(id), "0123456789abcdef") != "" {
		return "", badInput{fmt.Sprintf("group %q: want the 12 hex digits of a group's id", id)}
	}
	return strings.ToLower(id), nil
}

// countBefore is the time of the count a confirm page shows: the
// database's clock, which stamps failed_at, so that the action covers
// exactly the rows that had failed when the operator looked.
func (h *handler) countBefore(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := h.cfg.DB.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now)
	return now.Add(time.Microsecond), err
}

// outboxCount counts the outbox dead letters f matches, from their
// groups.
func (h *handler) outboxCount(ctx context.Context, f outbox.DeadFilter) (int64, error) {
	f.Limit = 100000
	groups, err := h.cfg.Outbox.DeadGroups(ctx, f)
	var n int64
	for _, g := range groups {
		n += g.Count
	}
	return n, err
}

// outboxPlan is the plan of a replay or purge of the outbox dead letters
// f matches.
func (h *handler) outboxPlan(target string, f outbox.DeadFilter, purge bool, rows int64, what string) plan {
	raw, _ := json.Marshal(f)
	p := plan{audit: outbox.AuditEntry{Action: "outbox.replay", Target: target, Filter: raw}, rows: rows, confirm: true,
		what: "replay " + what}
	verb := "replayed"
	if purge {
		p.audit.Action, p.what, verb = "outbox.purge", "purge "+what, "purged"
		p.warning = "Purged dead letters are deleted for good: their messages are never delivered."
	}
	p.run = func(ctx context.Context, tx pgx.Tx) (int64, error) {
		if purge {
			return h.cfg.Outbox.PurgeTx(ctx, tx, f)
		}
		return h.cfg.Outbox.ReplayTx(ctx, tx, f)
	}
	p.done = func(n int64) string { return fmt.Sprintf("%s %s of %s", verb, plural(n, "dead letter"), what) }
	return p
}

// planOutboxGroup replays or purges the outbox dead letters of a group
// that had failed by the time of the count.
func (h *handler) planOutboxGroup(ctx context.Context, fields map[string]string, purge bool, at time.Time) (plan, error) {
	id, err := groupID(fields)
	if err != nil {
		return plan{}, err
	}
	g, err := h.cfg.Outbox.DeadGroup(ctx, id)
	if errors.Is(err, outbox.ErrNoGroup) {
		g, err = outbox.DeadGroup{ID: id}, nil
	}
	if err != nil {
		return plan{}, err
	}
	f := g.Filter()
	f.FailedBefore = at
	what := "group " + id
	if g.Class != "" {
		what = fmt.Sprintf("group %s (%s on %s)", id, g.Class, g.Destination)
	}
	return h.outboxPlan(id, f, purge, g.Count, what), nil
}

// planReplaySince replays the outbox dead letters (of a destination, or
// of all of them when the form says so explicitly) that failed at or
// after a time and before the count.
func (h *handler) planReplaySince(ctx context.Context, fields map[string]string, at time.Time) (plan, error) {
	since, err := require(fields, "since")
	if err != nil {
		return plan{}, err
	}
	t, err := parseTime(since)
	if err != nil {
		return plan{}, badInput{"since: " + err.Error()}
	}
	dest, one := fields["destination"]
	all := fields["all_destinations"]
	switch {
	case one == (all != ""):
		return plan{}, badInput{"give a destination, or tick \"all destinations\": one of the two"}
	case all != "" && all != "on":
		return plan{}, badInput{fmt.Sprintf("all_destinations %q: want on", all)}
	case t.After(time.Now()):
		return plan{}, badInput{fmt.Sprintf("since %s is in the future", t.UTC().Format(time.RFC3339))}
	}
	f := outbox.DeadFilter{Destination: dest, FailedAfter: t, FailedBefore: at}
	n, err := h.outboxCount(ctx, f)
	if err != nil {
		return plan{}, err
	}
	what := "the dead letters of every destination that failed since " + t.UTC().Format(time.RFC3339)
	if one {
		what = fmt.Sprintf("the dead letters of %s that failed since %s", dest, t.UTC().Format(time.RFC3339))
	}
	return h.outboxPlan("since "+t.UTC().Format(time.RFC3339), f, false, n, what), nil
}

// planMessage replays or purges one outbox dead letter.
func (h *handler) planMessage(ctx context.Context, fields map[string]string, purge bool) (plan, error) {
	s, err := require(fields, "id")
	if err != nil {
		return plan{}, err
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return plan{}, badInput{fmt.Sprintf("id %q: not a message id", s)}
	}
	dead, err := h.cfg.Outbox.DeadLetters(ctx, outbox.DeadFilter{IDs: []uuid.UUID{id}})
	if err != nil {
		return plan{}, err
	}
	what := "dead letter " + id.String()
	if len(dead) == 1 {
		what = fmt.Sprintf("dead letter %s (key %q on %s)", id, dead[0].Key, dead[0].Destination)
	}
	return h.outboxPlan(id.String(), outbox.DeadFilter{IDs: []uuid.UUID{id}}, purge, int64(len(dead)), what), nil
}

// planInboxGroup releases or purges the inbox dead letters of a group
// that had failed by the time of the count.
func (h *handler) planInboxGroup(ctx context.Context, fields map[string]string, purge bool, at time.Time) (plan, error) {
	if h.cfg.Inbox == nil {
		return plan{}, badInput{"no inbox configured"}
	}
	id, err := groupID(fields)
	if err != nil {
		return plan{}, err
	}
	groups, err := h.cfg.Inbox.DeadGroups(ctx, inbox.DeadFilter{Limit: 100000})
	if err != nil {
		return plan{}, err
	}
	g := inbox.DeadGroup{ID: id}
	if i := slices.IndexFunc(groups, func(g inbox.DeadGroup) bool { return g.ID == id }); i >= 0 {
		g = groups[i]
	}
	f := g.Filter()
	f.FailedBefore = at
	raw, _ := json.Marshal(map[string]any{"scope": f.Scope, "error_class": f.ErrorClass, "failed_before": at})
	what := fmt.Sprintf("inbox group %s (%s in %s)", id, g.Class, g.Scope)
	p := plan{audit: outbox.AuditEntry{Action: "inbox.release", Target: id, Filter: raw}, rows: g.Count, confirm: true,
		what: "release the dead letters of " + what}
	verb := "released"
	if purge {
		p.audit.Action, p.what, verb = "inbox.purge", "purge the dead letters of "+what, "purged"
		p.warning = "A purged key is forgotten: a later delivery of its message is applied as a new one."
	}
	p.run = func(ctx context.Context, tx pgx.Tx) (int64, error) {
		if purge {
			return h.cfg.Inbox.PurgeTx(ctx, tx, f)
		}
		return h.cfg.Inbox.ReleaseTx(ctx, tx, f)
	}
	p.done = func(n int64) string { return fmt.Sprintf("%s %s of %s", verb, plural(n, "inbox dead letter"), what) }
	return p, nil
}

// planEnable enables a disabled webhook endpoint: one step, nothing is
// lost by it. The registry has no transactional call: the audit entry
// follows the enable.
func (h *handler) planEnable(ctx context.Context, fields map[string]string) (plan, error) {
	if h.cfg.Webhooks == nil {
		return plan{}, badInput{"no webhook registry configured"}
	}
	id, err := require(fields, "endpoint")
	if err != nil {
		return plan{}, err
	}
	ep, err := h.cfg.Webhooks.Get(ctx, id)
	if err != nil {
		return plan{}, err
	}
	raw, _ := json.Marshal(map[string]string{"endpoint": id, "was_disabled_because": ep.DisabledReason})
	p := plan{audit: outbox.AuditEntry{Action: "webhook.enable", Target: id, Filter: raw}, what: "enable endpoint " + id}
	if !ep.DisabledAt.IsZero() {
		p.rows = 1
	}
	p.run = func(ctx context.Context, _ pgx.Tx) (int64, error) { return 1, h.cfg.Webhooks.Enable(ctx, id) }
	p.done = func(int64) string { return "enabled endpoint " + id }
	return p, nil
}

// plural writes n things with thousands separators: "1 dead letter",
// "300,000 dead letters".
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return num(n) + " " + thing + "s"
}

// confirmToken signs what a confirm page showed: the user, the action and
// its fields, and the time of the count.
func (h *handler) confirmToken(user, action string, fields map[string]string, at string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("confirm\x00" + user + "\x00" + action + "\x00" + at))
	for _, name := range actionFields[action] {
		if v, ok := fields[name]; ok {
			m.Write([]byte("\x00" + name + "=" + v))
		}
	}
	return hex.EncodeToString(m.Sum(nil))
}

// confirmed returns the time of the count a confirm page showed, and
// whether r carries that page's token for exactly this user, action and
// fields, issued less than confirmTTL ago.
func (h *handler) confirmed(r *http.Request, user, action string, fields map[string]string) (time.Time, bool) {
	at := r.PostFormValue("confirm_at")
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil || time.Since(t).Abs() > confirmTTL || !equal(r.PostFormValue("confirm"), h.confirmToken(user, action, fields, at)) {
		return time.Time{}, false
	}
	return t, true
}

// confirmPage answers the first step of a destructive action: what it
// will do, to how many rows, with which filter, and a form that does it
// on the rows that had failed by count.
func (h *handler) confirmPage(w http.ResponseWriter, r *http.Request, user, action string, fields map[string]string, p plan, count time.Time, back string) {
	at := count.UTC().Format(time.RFC3339Nano)
	var hidden [][2]string
	for _, name := range actionFields[action] {
		if v, ok := fields[name]; ok {
			hidden = append(hidden, [2]string{name, v})
		}
	}
	var filter map[string]any
	_ = json.Unmarshal(p.audit.Filter, &filter)
	h.render(w, r, "confirm", "Confirm: "+p.what, map[string]any{"Action": action, "What": p.what, "Rows": p.rows, "Warning": p.warning,
		"Filter": filter, "Fields": hidden, "At": at, "Token": h.confirmToken(user, action, fields, at), "Back": back,
		"Purge": strings.HasPrefix(action, "purge")})
}

// backTo is the page to go back to after an action: a path of this
// console, never another site.
func backTo(s string) string {
	if !strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || strings.ContainsAny(s, "\\\r\n") {
		return "/audit"
	}
	return s
}
