package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/nilcheck"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Config configures the console. Outbox is required; the other stores add
// their pages when set.
type Config struct {
	// DB is the database the stores live in: actions run in its
	// transactions, so that an action and its audit entry commit
	// together. Required with AllowActions; a *pgxpool.Pool usually.
	DB outbox.DB
	// Outbox is the outbox whose backlog, relays and dead letters the
	// console shows; its audit log records every action. Required.
	Outbox *outbox.Outbox
	// Inbox adds the Inbox page (dead letters by group, conflicts) and
	// inbox records to lookups. Optional.
	Inbox *inbox.Store
	// Requests adds request records to lookups: *pgstore.Store implements
	// it. Optional.
	Requests RequestLookup
	// Webhooks adds the Webhooks page (failing and disabled endpoints,
	// enable). Optional.
	Webhooks *endpoints.Registry

	// AllowActions lets authenticated users act: replay, purge, release,
	// enable. Defaults to false: read-only.
	AllowActions bool
	// Token is a bearer token: requests carry it in an Authorization
	// header, browsers through the login page's cookie. Empty: no token.
	// Its user is "token" (the audit log's "ui:token") unless TokenName
	// names it.
	Token string
	// TokenName is who Token's user is in the page header and the audit
	// log ("ui:" + TokenName). Defaults to "token".
	TokenName string
	// Tokens are more bearer tokens, by the name of whoever holds each:
	// the audit log records "ui:" + name, so each operator's actions are
	// theirs. A name or token that is empty or blank, or a token given
	// twice, is refused.
	Tokens map[string]string
	// User and Password enable basic auth. Both or neither.
	User, Password string

	// Prefix is the path the handler is mounted under, for its links and
	// redirects: "/console" when mounted with http.StripPrefix("/console",
	// h). Defaults to "" (the root). It is a path of segments of letters,
	// digits and -._~ ("/ops/console"): no query, no "//", nothing a
	// redirect could take to another host.
	Prefix string
	// Logger receives page and action errors. Defaults to slog.Default().
	Logger *slog.Logger
}

// RequestLookup finds the request records of one idempotency key in every
// scope: *pgstore.Store implements it.
type RequestLookup interface {
	Lookup(ctx context.Context, key string) ([]request.Record, error)
}

// handler is the console.
type handler struct {
	cfg    Config
	pages  map[string]*template.Template
	secret []byte // signs the CSRF tokens
	mux    *http.ServeMux
	log    *slog.Logger
	rates  rateRing // the overview's observations (rates.go)
}

// NewHandler validates cfg and returns the console's handler. It touches
// no database: pages read it when they are requested. Invalid settings
// (no Outbox, half of basic auth, actions allowed with nobody to
// authenticate) match idemq.ErrConfig.
func NewHandler(cfg Config) (http.Handler, error) {
	if err := checkCredentials(cfg); err != nil {
		return nil, err
	}
	switch {
	case nilcheck.IsNil(cfg.Outbox):
		return nil, idemq.NewConfigError("console", "Outbox", "is required: the console shows an outbox")
	case (cfg.User == "") != (cfg.Password == ""):
		return nil, idemq.NewConfigError("console", "User", "and Password go together: set both for basic auth, or neither")
	case cfg.AllowActions && nilcheck.IsNil(cfg.DB):
		return nil, idemq.NewConfigError("console", "DB", "is required with AllowActions: actions and their audit entries commit in one transaction")
	case cfg.AllowActions && cfg.Token == "" && len(cfg.Tokens) == 0 && cfg.User == "":
		return nil, idemq.NewConfigError("console", "AllowActions", "needs a Token, Tokens or a User and Password: actions need an authenticated user")
	case cfg.Prefix != "" && !prefixPath.MatchString(cfg.Prefix):
		return nil, idemq.NewConfigError("console", "Prefix", "%q: want a path such as /console: segments of letters, digits and -._~, no trailing slash, query or //", cfg.Prefix)
	}
	if cfg.TokenName == "" {
		cfg.TokenName = "token"
	}
	if nilcheck.IsNil(cfg.Inbox) {
		cfg.Inbox = nil
	}
	if nilcheck.IsNil(cfg.Webhooks) {
		cfg.Webhooks = nil
	}
	if nilcheck.IsNil(cfg.Requests) {
		cfg.Requests = nil
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &handler{cfg: cfg, pages: map[string]*template.Template{}, secret: make([]byte, 32), mux: http.NewServeMux(), log: cfg.Logger}
	if _, err := rand.Read(h.secret); err != nil {
		return nil, err
	}
	for _, page := range []string{"overview", "dead", "message", "inbox", "webhooks", "lookup", "audit", "login", "problem", "confirm"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, err
		}
		h.pages[page] = t
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /dead", h.dead)
	h.mux.HandleFunc("GET /dead/{id}", h.message)
	h.mux.HandleFunc("GET /inbox", h.inbox)
	h.mux.HandleFunc("GET /webhooks", h.webhooks)
	h.mux.HandleFunc("GET /lookup", h.lookup)
	h.mux.HandleFunc("GET /audit", h.audit)
	h.mux.HandleFunc("GET /login", h.loginPage)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("POST /actions/{action}", h.act)
	h.mux.HandleFunc("/", h.notFound)
	// CrossOriginProtection refuses non-safe requests a browser marks
	// cross-site (Sec-Fetch-Site) or whose Origin is another host; the
	// form token (csrfToken) covers browsers that send neither.
	return http.NewCrossOriginProtection().Handler(h), nil
}

// prefixPath is a valid Config.Prefix.
var prefixPath = regexp.MustCompile(`^(?:/[A-Za-z0-9._~-]+)+$`)

// checkCredentials refuses blank tokens, names and passwords, a name
// without a token and a token given twice: each would let nobody in, or
// anybody, or record the wrong person.
func checkCredentials(cfg Config) error {
	blank := func(s string) bool { return s != "" && strings.TrimSpace(s) == "" }
	switch {
	case blank(cfg.Token):
		return idemq.NewConfigError("console", "Token", "is blank: give a real token, or none")
	case blank(cfg.User) || blank(cfg.Password):
		return idemq.NewConfigError("console", "User", "or Password is blank: give real ones, or neither")
	case cfg.TokenName != "" && (cfg.Token == "" || strings.TrimSpace(cfg.TokenName) == ""):
		return idemq.NewConfigError("console", "TokenName", "%q names no Token, or is blank", cfg.TokenName)
	}
	seen := map[string]bool{cfg.Token: cfg.Token != ""}
	for name, tok := range cfg.Tokens {
		switch {
		case strings.TrimSpace(name) == "":
			return idemq.NewConfigError("console", "Tokens", "has a token without a name: the audit log records the name")
		case strings.TrimSpace(tok) == "":
			return idemq.NewConfigError("console", "Tokens", "%q has an empty or blank token", name)
		case seen[tok]:
			return idemq.NewConfigError("console", "Tokens", "%q: a token is given twice: the audit log could not tell who acted", name)
		}
		seen[tok] = true
	}
	return nil
}

// ServeHTTP authenticates, then routes.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'none'; form-action 'self'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("Cache-Control", "no-store")
	if !strings.HasPrefix(r.URL.Path, "/static/") && r.URL.Path != "/login" && h.authRequired() && h.user(r) == "" {
		if h.cfg.User != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="idemq console", charset="UTF-8"`)
		}
		if h.tokens() && r.Method == http.MethodGet && !strings.Contains(r.Header.Get("Authorization"), " ") {
			http.Redirect(w, r, h.cfg.Prefix+"/login", http.StatusSeeOther)
			return
		}
		h.problem(w, r, http.StatusUnauthorized, "Authentication required", "Sign in: this console needs a token or a user and password.")
		return
	}
	if err := checkInput(r); err != nil {
		h.problem(w, r, http.StatusBadRequest, "Bad request", err.Error())
		return
	}
	h.mux.ServeHTTP(w, r)
}

// tokens reports whether bearer tokens are configured.
func (h *handler) tokens() bool { return h.cfg.Token != "" || len(h.cfg.Tokens) > 0 }

// authRequired reports whether a token or basic auth is configured: then
// every page needs it.
func (h *handler) authRequired() bool { return h.tokens() || h.cfg.User != "" }

// checkInput refuses a query or form value that is not valid UTF-8 or
// holds a NUL byte (%ff, %00): Postgres refuses both in text, and the
// page would fail with its raw error.
func checkInput(r *http.Request) error {
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("unreadable query or form: %v", err)
	}
	for name, values := range r.Form {
		for _, v := range append([]string{name}, values...) {
			if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
				return fmt.Errorf("parameter %q: not valid UTF-8 text (a NUL byte or an invalid byte sequence)", strings.ToValidUTF8(name, "?"))
			}
		}
	}
	return nil
}

// tokenCookie holds the bearer token a browser gave the login page.
const tokenCookie = "idemq_console_token"

// user returns the authenticated user of r, "" for none: the basic-auth
// user, or the name of the bearer token (header or cookie).
func (h *handler) user(r *http.Request) string {
	if h.tokens() {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			if c, err := r.Cookie(tokenCookie); err == nil {
				tok, ok = c.Value, true
			}
		}
		if name := h.tokenName(tok); ok && name != "" {
			return name
		}
	}
	if h.cfg.User != "" {
		if u, p, ok := r.BasicAuth(); ok && equal(u, h.cfg.User) && equal(p, h.cfg.Password) {
			return u
		}
	}
	return ""
}

// tokenName returns the name of token tok, "" for none. It compares tok
// with every token, each in constant time.
func (h *handler) tokenName(tok string) string {
	name := ""
	if h.cfg.Token != "" && equal(tok, h.cfg.Token) {
		name = h.cfg.TokenName
	}
	for n, t := range h.cfg.Tokens {
		if equal(tok, t) {
			name = n
		}
	}
	return name
}

// equal compares secrets in constant time.
func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// csrfToken is the form token of user: an HMAC of the user's name under
// the handler's secret, so a page of another user (or of no user) cannot
// be replayed.
func (h *handler) csrfToken(user string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("csrf\x00" + user))
	return hex.EncodeToString(m.Sum(nil))
}

// canAct reports whether r's user may act: actions allowed and a user.
func (h *handler) canAct(r *http.Request) bool { return h.cfg.AllowActions && h.user(r) != "" }

func (h *handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", "Sign in", map[string]any{"TokenLogin": h.tokens()})
}

// login checks the token posted by the login form and keeps it in an
// HttpOnly, SameSite=Strict cookie.
func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	tok := r.PostFormValue("token")
	if h.tokenName(tok) == "" {
		time.Sleep(500 * time.Millisecond) // slow down guessing
		h.problem(w, r, http.StatusUnauthorized, "Sign in", "wrong token")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: tok, Path: cmpOr(h.cfg.Prefix, "/"), HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: 12 * 3600})
	http.Redirect(w, r, h.cfg.Prefix+"/", http.StatusSeeOther)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
