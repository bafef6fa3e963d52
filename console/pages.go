package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return human(time.Since(t)) + " ago"
	},
	"dur": func(d time.Duration) string {
		if d <= 0 {
			return "-"
		}
		return human(d)
	},
	"num":       num,
	"hasPrefix": strings.HasPrefix,
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"clip": func(s string, n int) string {
		r := []rune(s)
		if len(r) <= n {
			return s
		}
		return string(r[:n-1]) + "…"
	},
	"payload": func(p []byte) string {
		var out bytes.Buffer
		if json.Indent(&out, p, "", "  ") == nil {
			return out.String()
		}
		if strings.ToValidUTF8(string(p), "") == string(p) {
			return string(p)
		}
		return fmt.Sprintf("(%d bytes of binary)", len(p))
	},
	"status": func(s inbox.Status) string { return s.String() },
	"query":  func(kv ...string) template.URL { return query(kv...) },
	"rate":   func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
}

// num writes an integer with thousands separators: 1,234,567.
func num(v any) string {
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case int64:
		n = x
	case int32:
		n = int64(x)
	default:
		return fmt.Sprint(v)
	}
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// human writes d as a person reads it, in its two largest units: "350
// ms", "42 s", "12 min 5 s", "5 h 12 min", "7 days 0 h".
func human(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Round(time.Second).Seconds()))
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
	}
	d = d.Round(time.Hour)
	days := int(d.Hours()) / 24
	unit := "days"
	if days == 1 {
		unit = "day"
	}
	return fmt.Sprintf("%d %s %d h", days, unit, int(d.Hours())%24)
}

// query builds a query string from key, value pairs, leaving out empty
// values.
func query(kv ...string) template.URL {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	if len(v) == 0 {
		return ""
	}
	return template.URL("?" + v.Encode())
}

// view is what every page's template gets.
type view struct {
	Title, Prefix, User, CSRF, Flash, Error string
	Page                                    string
	CanAct, ActionsAllowed                  bool
	HasInbox, HasWebhooks                   bool
	Data                                    any
}

// render executes page's template with data, buffered, so that an error
// becomes a 500 and not half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, page, title string, data any) {
	h.renderStatus(w, r, http.StatusOK, page, title, data)
}

// renderStatus is render with a status other than 200.
func (h *handler) renderStatus(w http.ResponseWriter, r *http.Request, status int, page, title string, data any) {
	user := h.user(r)
	f := h.takeFlash(w, r, user)
	v := view{Title: title, Prefix: h.cfg.Prefix, User: user, Page: page, CanAct: h.canAct(r), ActionsAllowed: h.cfg.AllowActions,
		HasInbox: h.cfg.Inbox != nil, HasWebhooks: h.cfg.Webhooks != nil, Data: data, Flash: f.Done, Error: f.Error}
	if v.CanAct {
		v.CSRF = h.csrfToken(user)
	}
	var buf bytes.Buffer
	if err := h.pages[page].Execute(&buf, v); err != nil {
		h.log.ErrorContext(r.Context(), "console: page failed", "path", r.URL.Path, "err", err)
		http.Error(w, "the console could not render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// problem answers status with a page in the console's layout that says
// what went wrong and, in hint, what to do.
func (h *handler) problem(w http.ResponseWriter, r *http.Request, status int, title, msg string, hint ...string) {
	h.renderStatus(w, r, status, "problem", title, map[string]any{"Message": msg, "Hint": strings.Join(hint, " ")})
}

// fail answers a page whose data could not be read: an unmigrated
// database says which table is missing and the command that creates it;
// anything else is a 500 in the console's layout.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.log.ErrorContext(r.Context(), "console: page failed", "path", r.URL.Path, "err", err)
	if missing, ok := unmigrated(err); ok {
		h.problem(w, r, http.StatusServiceUnavailable, "Database not migrated", "The database lacks idemq's tables: "+missing+".",
			"Create them with: idemq migrate --components "+h.components()+" (or call Migrate on each store), then reload this page.")
		return
	}
	h.problem(w, r, http.StatusInternalServerError, "Database error", "The console could not read the database: "+err.Error())
}

// unmigrated reports whether err is Postgres saying a table, column or
// schema is missing (42P01, 42703, 3F000), and what.
func unmigrated(err error) (string, bool) {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42P01" || pg.Code == "42703" || pg.Code == "3F000") {
		return pg.Message, true
	}
	return "", false
}

// components lists the idemq migrate components of the stores the console
// shows.
func (h *handler) components() string {
	c := []string{"outbox"}
	if h.cfg.Inbox != nil {
		c = append(c, "inbox")
	}
	if h.cfg.Webhooks != nil {
		c = append(c, "webhook")
	}
	return strings.Join(c, ",")
}

// notFound answers a page the console does not have (or not with this
// configuration) in its layout.
func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.problem(w, r, http.StatusNotFound, "Not found", "The console has no page "+r.URL.Path+".")
}

// pageSize is the number of dead letters a page lists.
const pageSize = 100

// filterParams are the dead-letter page's filter fields.
var filterParams = []string{"destination", "key_prefix", "class", "since", "until", "group", "after"}

// emptyFilters returns r's URL without the filter fields a form sent
// empty (its unset fields), and whether there were any: the page
// redirects there, so that a URL never holds an empty filter. A blank
// value (spaces) is not dropped: deadFilter refuses it.
func emptyFilters(r *http.Request, names []string) (string, bool) {
	q := r.URL.Query()
	dropped := false
	for _, name := range names {
		if vs, ok := q[name]; ok && len(vs) > 0 && vs[0] == "" {
			q.Del(name)
			dropped = true
		}
	}
	u := *r.URL
	u.RawQuery = q.Encode()
	return u.RequestURI(), dropped
}

// deadFilter reads the dead-letter filters of a page's query. A blank
// value is refused: it would match nothing, or, read as unset, everything.
func deadFilter(r *http.Request) (outbox.DeadFilter, error) {
	q := r.URL.Query()
	for _, name := range filterParams {
		if v, ok := q[name]; ok && (len(v) != 1 || strings.TrimSpace(v[0]) == "") {
			return outbox.DeadFilter{}, fmt.Errorf("%s: want one non-blank value, got %q: leave the field out to not filter by it", name, v)
		}
	}
	f := outbox.DeadFilter{Destination: q.Get("destination"), KeyPrefix: q.Get("key_prefix"), ErrorClass: q.Get("class"), Limit: 100}
	if after := q.Get("after"); after != "" {
		id, err := uuid.Parse(after)
		if err != nil {
			return f, fmt.Errorf("after: %w", err)
		}
		f.After = id
	}
	for name, at := range map[string]*time.Time{"since": &f.FailedAfter, "until": &f.FailedBefore} {
		if s := q.Get(name); s != "" {
			t, err := parseTime(s)
			if err != nil {
				return f, fmt.Errorf("%s: %w", name, err)
			}
			*at = t
		}
	}
	return f, nil
}

// parseTime reads a time from a form: RFC 3339, or the browser's
// datetime-local (taken as UTC).
func parseTime(s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339, "2006-01-02T15:04", "2006-01-02T15:04:05", time.DateTime, time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time: want 2006-01-02T15:04 or RFC 3339", s)
}

func (h *handler) dead(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if to, ok := emptyFilters(r, filterParams); ok {
		http.Redirect(w, r, h.cfg.Prefix+to, http.StatusSeeOther)
		return
	}
	f, err := deadFilter(r)
	if err != nil {
		h.problem(w, r, http.StatusBadRequest, "Bad filter", err.Error())
		return
	}
	data := map[string]any{"Filter": f, "Since": r.URL.Query().Get("since"), "Until": r.URL.Query().Get("until")}
	all := f
	all.After = uuid.Nil // a page of one group's messages, not of the groups
	groups, err := h.cfg.Outbox.DeadGroups(ctx, all)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	data["Groups"] = groups
	if id := r.URL.Query().Get("group"); id != "" {
		g, err := groupIn(groups, id)
		if err != nil {
			// Not among the page's groups (a filter, or past the first
			// 100): look it up among all.
			g, err = h.cfg.Outbox.DeadGroup(ctx, id)
		}
		switch {
		case errors.Is(err, outbox.ErrNoGroup):
			data["Missing"] = id
		case err != nil:
			h.fail(w, r, err)
			return
		default:
			data["Group"] = g
			gf := g.Filter()
			gf.KeyPrefix, gf.FailedAfter, gf.FailedBefore, gf.Limit = f.KeyPrefix, f.FailedAfter, f.FailedBefore, pageSize
			gf.After = f.After
			dead, err := h.cfg.Outbox.DeadLetters(ctx, gf)
			if err != nil {
				h.fail(w, r, err)
				return
			}
			data["Messages"] = dead
			if len(dead) == pageSize {
				data["Next"] = dead[len(dead)-1].ID.String()
			}
		}
	}
	h.render(w, r, "dead", "Dead letters", data)
}

// groupIn returns the group of groups whose ID is id.
func groupIn(groups []outbox.DeadGroup, id string) (outbox.DeadGroup, error) {
	for _, g := range groups {
		if g.ID == id {
			return g, nil
		}
	}
	return outbox.DeadGroup{}, outbox.ErrNoGroup
}

func (h *handler) message(w http.ResponseWriter, r *http.Request) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.problem(w, r, http.StatusBadRequest, "Not a message id", "not a message id: "+err.Error())
		return
	}
	dead, err := h.cfg.Outbox.DeadLetters(r.Context(), outbox.DeadFilter{IDs: []uuid.UUID{id}})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(dead) == 0 {
		h.problem(w, r, http.StatusNotFound, "No such dead letter", "No dead letter with id "+id.String()+": replayed or purged?",
			"Look the id up to see where it is now.")
		return
	}
	d := dead[0]
	var headers []string
	for k := range d.Headers {
		headers = append(headers, k)
	}
	sort.Strings(headers)
	h.render(w, r, "message", "Dead letter "+id.String(), map[string]any{"M": d, "HeaderNames": headers,
		"GroupID": outbox.GroupID(d.ErrorClass, d.Destination)})
}

// expiredLeasesCap is how many expired leases the inbox page reads per
// scope at most; beyond it the page says "≥ N".
const expiredLeasesCap = 1000

func (h *handler) inbox(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Inbox == nil {
		h.notFound(w, r)
		return
	}
	ctx := r.Context()
	if to, ok := emptyFilters(r, []string{"scope"}); ok {
		http.Redirect(w, r, h.cfg.Prefix+to, http.StatusSeeOther)
		return
	}
	scope := r.URL.Query().Get("scope")
	if _, ok := r.URL.Query()["scope"]; ok && strings.TrimSpace(scope) == "" {
		h.problem(w, r, http.StatusBadRequest, "Bad filter", "scope: blank: leave the field out to see every scope")
		return
	}
	groups, err := h.cfg.Inbox.DeadGroups(ctx, inbox.DeadFilter{Scope: scope})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	conflicts, err := h.cfg.Inbox.Conflicts(ctx, inbox.DeadFilter{Scope: scope, Limit: 100})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	all, err := h.cfg.Inbox.ExpiredLeases(ctx, expiredLeasesCap)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	leases := all[:0]
	for _, e := range all {
		if scope == "" || e.Scope == scope {
			leases = append(leases, e)
		}
	}
	h.render(w, r, "inbox", "Inbox", map[string]any{"Scope": scope, "Groups": groups, "Conflicts": conflicts, "Leases": leases})
}

func (h *handler) webhooks(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Webhooks == nil {
		h.notFound(w, r)
		return
	}
	eps, err := h.cfg.Webhooks.List(r.Context())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var failing, disabled, healthy []endpoints.Endpoint
	for _, ep := range eps {
		switch {
		case !ep.DisabledAt.IsZero():
			disabled = append(disabled, ep)
		case !ep.FailingSince.IsZero(), ep.Breaker == endpoints.BreakerOpen, ep.Breaker == endpoints.BreakerHalfOpen:
			failing = append(failing, ep)
		default:
			healthy = append(healthy, ep)
		}
	}
	h.render(w, r, "webhooks", "Webhook endpoints", map[string]any{"Disabled": disabled, "Failing": failing, "Healthy": healthy})
}

func (h *handler) lookup(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	key := strings.TrimSpace(r.URL.Query().Get("key"))
	data := map[string]any{"Key": key, "Window": outbox.PendingWindow}
	if key != "" {
		pending, err := h.cfg.Outbox.PendingByKey(ctx, key, 100)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		f := outbox.DeadFilter{Key: key}
		if id, err := uuid.Parse(key); err == nil {
			f = outbox.DeadFilter{IDs: []uuid.UUID{id}}
		}
		dead, err := h.cfg.Outbox.DeadLetters(ctx, f)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		data["Pending"], data["Dead"] = pending, dead
		if h.cfg.Inbox != nil {
			recs, err := h.cfg.Inbox.Lookup(ctx, key)
			if err != nil {
				h.fail(w, r, err)
				return
			}
			data["Inbox"] = recs
		}
		if h.cfg.Requests != nil {
			recs, err := h.cfg.Requests.Lookup(ctx, key)
			if err != nil {
				h.fail(w, r, err)
				return
			}
			data["Requests"] = recs
		}
	}
	h.render(w, r, "lookup", "Look up a key", data)
}

func (h *handler) audit(w http.ResponseWriter, r *http.Request) {
	var before int64
	if s := r.URL.Query().Get("before"); s != "" {
		var err error
		if before, err = strconv.ParseInt(s, 10, 64); err != nil || before <= 0 {
			h.problem(w, r, http.StatusBadRequest, "Bad page link", fmt.Sprintf("before %q: want an entry number", s))
			return
		}
	}
	const page = 50
	entries, err := h.cfg.Outbox.AuditLog(r.Context(), before, page)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var next int64
	if len(entries) == page {
		next = entries[len(entries)-1].ID
	}
	h.render(w, r, "audit", "Audit log", map[string]any{"Entries": entries, "Next": next})
}
