package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
)

// act runs one action. It refuses it with 403 unless actions are allowed
// and the user is authenticated, and unless the form's CSRF token is the
// user's; then it runs the action and its audit entry in one transaction
// and redirects back (post/redirect/get) with what it did.
func (h *handler) act(w http.ResponseWriter, r *http.Request) {
	user := h.user(r)
	switch {
	case !h.cfg.AllowActions:
		http.Error(w, "read-only console: actions are off (Config.AllowActions, idemq ui --allow-actions)", http.StatusForbidden)
		return
	case user == "":
		http.Error(w, "actions need an authenticated user", http.StatusForbidden)
		return
	case !equal(r.PostFormValue("csrf"), h.csrfToken(user)):
		http.Error(w, "missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	actor := "ui:" + user
	ctx := r.Context()
	var done string
	var err error
	switch action := r.PathValue("action"); action {
	case "replay-group", "purge-group":
		done, err = h.outboxGroup(ctx, actor, r.PostFormValue("group"), action == "purge-group")
	case "replay-since":
		done, err = h.replaySince(ctx, actor, r.PostFormValue("destination"), r.PostFormValue("since"))
	case "release-group":
		done, err = h.releaseGroup(ctx, actor, r.PostFormValue("group"))
	case "enable-endpoint":
		done, err = h.enableEndpoint(ctx, actor, r.PostFormValue("endpoint"))
	default:
		http.Error(w, "no action "+action, http.StatusNotFound)
		return
	}
	back := backTo(r.PostFormValue("return"))
	v := url.Values{}
	if err != nil {
		h.log.ErrorContext(ctx, "console: action failed", "action", r.PathValue("action"), "user", user, "err", err)
		v.Set("error", err.Error())
	} else {
		h.log.InfoContext(ctx, "console: action", "action", r.PathValue("action"), "user", user, "done", done)
		v.Set("done", done)
	}
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	http.Redirect(w, r, h.cfg.Prefix+back+sep+v.Encode(), http.StatusSeeOther)
}

// backTo is the page to go back to after an action: a path of this
// console, never another site.
func backTo(s string) string {
	if !strings.HasPrefix(s, "/") || strings.HasPrefix(s, "//") || strings.ContainsAny(s, "\\\r\n") {
		return "/audit"
	}
	return s
}

// inTx runs fn and the audit entry it returns in one transaction.
func (h *handler) inTx(ctx context.Context, fn func(tx pgx.Tx) (outbox.AuditEntry, error)) (int64, error) {
	var rows int64
	err := pgx.BeginFunc(ctx, h.cfg.DB, func(tx pgx.Tx) error {
		e, err := fn(tx)
		if err != nil {
			return err
		}
		rows = e.Rows
		return h.cfg.Outbox.RecordAuditTx(ctx, tx, e)
	})
	return rows, err
}

// outboxGroup replays or purges the outbox dead letters of group id. A
// group that is gone (replayed or purged already) changes nothing.
func (h *handler) outboxGroup(ctx context.Context, actor, id string, purge bool) (string, error) {
	g, err := h.cfg.Outbox.DeadGroup(ctx, id)
	if errors.Is(err, outbox.ErrNoGroup) {
		return "nothing to do: no dead letters left in group " + id, nil
	}
	if err != nil {
		return "", err
	}
	f := g.Filter()
	action, verb := "outbox.replay", "replayed"
	if purge {
		action, verb = "outbox.purge", "purged"
	}
	n, err := h.inTx(ctx, func(tx pgx.Tx) (outbox.AuditEntry, error) {
		var n int64
		var err error
		if purge {
			n, err = h.cfg.Outbox.PurgeTx(ctx, tx, f)
		} else {
			n, err = h.cfg.Outbox.ReplayTx(ctx, tx, f)
		}
		raw, _ := json.Marshal(f)
		return outbox.AuditEntry{Actor: actor, Action: action, Target: g.ID, Filter: raw, Rows: n}, err
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %d dead letters of group %s (%s on %s)", verb, n, g.ID, g.Class, g.Destination), nil
}

// replaySince replays every outbox dead letter (of destination, if given)
// that failed at or after since.
func (h *handler) replaySince(ctx context.Context, actor, destination, since string) (string, error) {
	t, err := parseTime(since)
	if err != nil {
		return "", err
	}
	if t.After(time.Now()) {
		return "", fmt.Errorf("since %s is in the future", t.UTC().Format(time.RFC3339))
	}
	f := outbox.DeadFilter{Destination: destination, FailedAfter: t}
	n, err := h.inTx(ctx, func(tx pgx.Tx) (outbox.AuditEntry, error) {
		n, err := h.cfg.Outbox.ReplayTx(ctx, tx, f)
		raw, _ := json.Marshal(f)
		return outbox.AuditEntry{Actor: actor, Action: "outbox.replay", Target: "since " + t.UTC().Format(time.RFC3339), Filter: raw, Rows: n}, err
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("replayed %d dead letters that failed since %s", n, t.UTC().Format(time.RFC3339)), nil
}

// releaseGroup releases the inbox dead letters of group id: their next
// delivery is applied afresh.
func (h *handler) releaseGroup(ctx context.Context, actor, id string) (string, error) {
	if h.cfg.Inbox == nil {
		return "", errors.New("no inbox configured")
	}
	groups, err := h.cfg.Inbox.DeadGroups(ctx, inbox.DeadFilter{Limit: 100000})
	if err != nil {
		return "", err
	}
	for _, g := range groups {
		if g.ID != id {
			continue
		}
		f := g.Filter()
		n, err := h.inTx(ctx, func(tx pgx.Tx) (outbox.AuditEntry, error) {
			n, err := h.cfg.Inbox.ReleaseTx(ctx, tx, f)
			raw, _ := json.Marshal(f)
			return outbox.AuditEntry{Actor: actor, Action: "inbox.release", Target: g.ID, Filter: raw, Rows: n}, err
		})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("released %d inbox dead letters of group %s (%s in %s)", n, g.ID, g.Class, g.Scope), nil
	}
	return "nothing to do: no dead letters left in inbox group " + id, nil
}

// enableEndpoint enables a disabled webhook endpoint. The registry has no
// transactional call: the audit entry follows the enable.
func (h *handler) enableEndpoint(ctx context.Context, actor, id string) (string, error) {
	if h.cfg.Webhooks == nil {
		return "", errors.New("no webhook registry configured")
	}
	ep, err := h.cfg.Webhooks.Get(ctx, id)
	if err != nil {
		return "", err
	}
	if ep.DisabledAt.IsZero() {
		return "nothing to do: endpoint " + id + " is enabled", nil
	}
	if err := h.cfg.Webhooks.Enable(ctx, id); err != nil {
		return "", err
	}
	raw, _ := json.Marshal(map[string]string{"endpoint": id, "was_disabled_because": ep.DisabledReason})
	_, err = h.inTx(ctx, func(pgx.Tx) (outbox.AuditEntry, error) {
		return outbox.AuditEntry{Actor: actor, Action: "webhook.enable", Target: id, Filter: raw, Rows: 1}, nil
	})
	if err != nil {
		return "", fmt.Errorf("endpoint %s enabled, but the audit log failed: %w", id, err)
	}
	return "enabled endpoint " + id, nil
}
