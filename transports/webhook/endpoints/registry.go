package endpoints

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgtx"
	"github.com/idemq/idemq/internal/pgutil"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/transports/webhook/signing"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is what the registry needs from a database handle: a *pgxpool.Pool, a
// *pgx.Conn and a pgx.Tx all satisfy it.
type DB = pgutil.DB

// Defaults of [RegistryConfig].
const (
	SchemaDefault = "public"
	TableDefault  = "idemq_webhook_endpoints"
)

// RegistryConfig configures a [Registry].
type RegistryConfig struct {
	// Schema holds the tables. Defaults to "public".
	Schema string
	// Table is the endpoint table; keys live in Table+"_keys". Defaults to
	// "idemq_webhook_endpoints".
	Table string
}

func (c RegistryConfig) withDefaults() RegistryConfig {
	c.Schema = cmp.Or(c.Schema, SchemaDefault)
	c.Table = cmp.Or(c.Table, TableDefault)
	return c
}

// Endpoint is a registered receiver of webhooks.
type Endpoint struct {
	// ID names the endpoint; outbox rows for it have the destination
	// "webhook/"+ID. Letters, digits and "_.-", at most 200 bytes; Add
	// generates a UUIDv7 when empty.
	ID string
	// URL receives the POSTs: http or https.
	URL string
	// EventTypes filters the events fanned out to the endpoint; empty
	// means every type.
	EventTypes []string
	// Keys sign every delivery (see signing.ParseKey); at least one that
	// signs on Add.
	// Reading an endpoint returns the keys that sign now.
	Keys []string
	// Timeout bounds one delivery; 0 takes the Sink's Config.Timeout.
	Timeout time.Duration
	// Concurrency bounds the deliveries in flight to the endpoint; 0 takes
	// the Sink's Config.Concurrency.
	Concurrency int
	// RateLimit caps deliveries per second; 0 means unlimited.
	RateLimit float64
	// DisabledAt is when the endpoint was disabled, zero while enabled.
	DisabledAt time.Time
	// DisabledReason says why (a 410, consistent failure, an operator).
	DisabledReason string
	// FailingSince is the first failed delivery since the last success,
	// zero when the last delivery succeeded.
	FailingSince time.Time
	// Breaker is the endpoint's breaker as a Sink last reported it, ""
	// until a breaker first opened. Each relay's Sink has its own breaker
	// per endpoint and reports each change of its state (not each
	// delivery); with several relays the last report wins. The report of
	// a relay that stopped stays until another one reports.
	Breaker BreakerState
	// BreakerSince is when the reporting Sink's breaker changed to
	// Breaker, by that relay's clock; zero when Breaker is "".
	BreakerSince time.Time
	// BreakerRelay names the Sink that reported Breaker: its
	// webhook.Config.Instance.
	BreakerRelay string
	// CreatedAt and UpdatedAt are kept by the registry.
	CreatedAt, UpdatedAt time.Time
}

// BreakerState is a state of an endpoint's breaker (see
// webhook.Config.BreakerFailures).
type BreakerState string

// The states of a breaker.
const (
	// BreakerOpen holds the endpoint's rows, without attempts, until its
	// cooldown ends.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen lets one delivery through, the probe, and holds the
	// others until it ends: a success closes the breaker, a retryable
	// failure opens it again for a doubled cooldown.
	BreakerHalfOpen BreakerState = "half-open"
	// BreakerClosed lets every delivery through.
	BreakerClosed BreakerState = "closed"
)

// Enabled reports whether deliveries flow to the endpoint.
func (e Endpoint) Enabled() bool { return e.DisabledAt.IsZero() }

// ErrNotMigrated is matched by the error of a registry call on a database
// whose registry tables are missing or older than this code (Postgres's
// undefined table, column or schema): it says what is missing and the
// command that creates it, and wraps Postgres's own error.
var ErrNotMigrated = errors.New("webhook: the endpoint registry's tables are missing or out of date: " +
	"run `idemq migrate --components webhook` (with the registry's --schema and --webhook-table) or Registry.Migrate first")

// dbError wraps err, the database's error for the registry's call what,
// marking a missing table, column or schema with [ErrNotMigrated].
func dbError(what string, err error) error {
	if pgutil.Undefined(err) {
		return fmt.Errorf("%w (%s): %w", ErrNotMigrated, what, err)
	}
	return fmt.Errorf("webhook: %s: %w", what, err)
}

// ErrEndpointNotFound is returned for an endpoint id the registry does not
// hold. The Sink dead-letters rows of such an endpoint.
var ErrEndpointNotFound = errors.New("webhook: endpoint not found")

var endpointID = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,200}$`)

// Registry stores the webhook endpoints and their key rings in Postgres.
// It is safe for concurrent use.
type Registry struct {
	db    DB
	table pgutil.Table
	sql   registrySQL
}

// NewRegistry validates cfg and returns a registry on db. Call
// [Registry.Migrate] once before use.
func NewRegistry(db DB, cfg RegistryConfig) (*Registry, error) {
	if pgtx.IsNil(db) {
		return nil, idemq.NewConfigError("endpoints.Registry", "db", "is nil")
	}
	cfg = cfg.withDefaults()
	t, err := pgutil.ConfigTable("endpoints.Registry", cfg.Schema, cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Registry{db: db, table: t, sql: newRegistrySQL(t)}, nil
}

// Migrate creates or upgrades the registry tables on the Registry's
// handle: [migrate.New] of this Registry alone. It is safe to run from
// several processes at once.
func (r *Registry) Migrate(ctx context.Context) error {
	_, err := migrate.New(r.db, r).Migrate(ctx)
	return err
}

// PendingMigrations returns the migrations Migrate would apply, in order;
// none once the tables are up to date.
func (r *Registry) PendingMigrations(ctx context.Context) ([]migrate.Migration, error) {
	return migrate.New(r.db, r).Pending(ctx)
}

// MigrationSource implements [migrate.Store]: the registry tables'
// migrations.
func (r *Registry) MigrationSource() migrate.Source {
	return migrate.Source{Component: "webhook", Schema: r.table.Schema, Table: r.table.Name, Files: migrations, Dir: "migrations"}
}

type registrySQL struct {
	insert, insertKey, update, expireKeys, disable, enable, remove, get, failing, succeeded, breaker, enabled string
}

func newRegistrySQL(t pgutil.Table) registrySQL {
	ep, keys := t.String(), t.Ident("_keys")
	// Active keys, oldest first, as one array per endpoint.
	const cols = `e.id, e.url, e.event_types, e.timeout_ms, e.concurrency, e.rate_per_sec, e.disabled_at, e.disabled_reason,
       e.failing_since, e.created_at, e.updated_at, e.breaker_state, e.breaker_since, e.breaker_relay`
	activeKeys := `ARRAY(SELECT k.secret FROM ` + keys + ` AS k
             WHERE k.endpoint_id = e.id AND (k.expires_at IS NULL OR k.expires_at > now()) ORDER BY k.seq)`
	return registrySQL{
		insert: `INSERT INTO ` + ep + ` (id, url, event_types, timeout_ms, concurrency, rate_per_sec)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at`,
		insertKey: `INSERT INTO ` + keys + ` (endpoint_id, secret) VALUES ($1, $2)`,
		update: `UPDATE ` + ep + ` SET url = $2, event_types = $3, timeout_ms = $4, concurrency = $5, rate_per_sec = $6,
updated_at = now() WHERE id = $1`,
		// Only keys without an expiry get one: a key already on its way
		// out keeps its earlier end.
		expireKeys: `UPDATE ` + keys + ` SET expires_at = now() + $2 * interval '1 microsecond'
WHERE endpoint_id = $1 AND expires_at IS NULL`,
		disable: `UPDATE ` + ep + ` SET disabled_at = now(), disabled_reason = $2, updated_at = now()
WHERE id = $1 AND disabled_at IS NULL`,
		// Re-enabling restarts the failure clock: the endpoint gets the
		// full DisableAfter again.
		enable: `UPDATE ` + ep + ` SET disabled_at = NULL, disabled_reason = '', failing_since = NULL, updated_at = now()
WHERE id = $1`,
		remove:    `DELETE FROM ` + ep + ` WHERE id = $1`,
		get:       `SELECT ` + cols + `, ` + activeKeys + ` FROM ` + ep + ` AS e WHERE $1::text[] IS NULL OR e.id = ANY($1) ORDER BY e.id`,
		failing:   `UPDATE ` + ep + ` SET failing_since = coalesce(failing_since, now()) WHERE id = $1 RETURNING failing_since`,
		succeeded: `UPDATE ` + ep + ` SET failing_since = NULL WHERE id = $1 AND failing_since IS NOT NULL`,
		// A Sink's report of its breaker: the last writer wins.
		breaker: `UPDATE ` + ep + ` SET breaker_state = $2, breaker_since = $3, breaker_relay = $4 WHERE id = $1`,
		// Fan-out reads the endpoints subscribed to any of the event types
		// $1 in the caller's transaction, so an endpoint added or disabled
		// by a transaction that commits first is seen.
		enabled: `SELECT id, event_types FROM ` + ep + `
WHERE disabled_at IS NULL AND (event_types = '{}' OR event_types && $1::text[]) ORDER BY id`,
	}
}

// validate checks what Add and Update store.
func (e Endpoint) validate() error {
	if !endpointID.MatchString(e.ID) {
		return fmt.Errorf("webhook: endpoint id %q: want 1 to 200 letters, digits or _.-", e.ID)
	}
	u, err := url.Parse(e.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("webhook: endpoint %s: URL %q is not an absolute http(s) URL", e.ID, e.URL)
	}
	for _, t := range e.EventTypes {
		if !validType(t) {
			return fmt.Errorf("webhook: endpoint %s: event type %q: want dotted letters, digits and underscores", e.ID, t)
		}
	}
	switch {
	case e.Timeout < 0:
		return fmt.Errorf("webhook: endpoint %s: Timeout %v is negative", e.ID, e.Timeout)
	case e.Timeout > 0 && e.Timeout < time.Millisecond:
		// Stored in milliseconds, it would become 0, the Sink's default.
		return fmt.Errorf("webhook: endpoint %s: Timeout %v is below the stored unit of 1ms", e.ID, e.Timeout)
	case e.Concurrency < 0:
		return fmt.Errorf("webhook: endpoint %s: Concurrency %d is negative", e.ID, e.Concurrency)
	case e.RateLimit < 0 || math.IsNaN(e.RateLimit) || math.IsInf(e.RateLimit, 0):
		return fmt.Errorf("webhook: endpoint %s: RateLimit %v: want a finite number of deliveries per second, 0 for unlimited", e.ID, e.RateLimit)
	}
	return nil
}

func eventTypes(e Endpoint) []string {
	if e.EventTypes == nil {
		return []string{}
	}
	return e.EventTypes
}

// Add registers ep, enabled, and returns it as stored (with its generated
// ID). ep.Keys must hold at least one key that signs (whsec_ or whsk_).
func (r *Registry) Add(ctx context.Context, ep Endpoint) (Endpoint, error) {
	if ep.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return Endpoint{}, err
		}
		ep.ID = id.String()
	}
	if err := ep.validate(); err != nil {
		return Endpoint{}, err
	}
	if err := signingKeys(ep.Keys); err != nil {
		return Endpoint{}, fmt.Errorf("webhook: endpoint %s: %w", ep.ID, err)
	}
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, r.sql.insert, ep.ID, ep.URL, eventTypes(ep), ep.Timeout.Milliseconds(), ep.Concurrency, ep.RateLimit).Scan(&ep.CreatedAt); err != nil {
			return dbError("add endpoint "+ep.ID, err)
		}
		for _, k := range ep.Keys {
			if _, err := tx.Exec(ctx, r.sql.insertKey, ep.ID, k); err != nil {
				return dbError("add endpoint "+ep.ID+": key", err)
			}
		}
		return nil
	})
	if err != nil {
		return Endpoint{}, err
	}
	ep.UpdatedAt = ep.CreatedAt
	ep.DisabledAt, ep.DisabledReason, ep.FailingSince = time.Time{}, "", time.Time{}
	ep.Breaker, ep.BreakerSince, ep.BreakerRelay = "", time.Time{}, ""
	return ep, nil
}

// signingKeys checks that keys parse and that at least one of them signs.
func signingKeys(keys []string) error {
	parsed, err := signing.ParseKeys(keys...)
	if err != nil {
		return err
	}
	for _, k := range parsed {
		if k.Signs() {
			return nil
		}
	}
	return fmt.Errorf("%w: no key that signs (want a %s or %s key)", signing.ErrInvalidSigningKey, signing.SecretPrefix, signing.PrivateKeyPrefix)
}

// Update replaces the URL, event types, timeout, concurrency and rate limit
// of the endpoint ep.ID. Keys and the enabled state have their own calls.
// Deliveries pick the change up within the Sink's Config.RefreshInterval.
func (r *Registry) Update(ctx context.Context, ep Endpoint) error {
	if err := ep.validate(); err != nil {
		return err
	}
	tag, err := r.db.Exec(ctx, r.sql.update, ep.ID, ep.URL, eventTypes(ep), ep.Timeout.Milliseconds(), ep.Concurrency, ep.RateLimit)
	return affected(tag.RowsAffected(), err, "update", ep.ID)
}

func affected(n int64, err error, what, id string) error {
	if err != nil {
		return dbError(what+" endpoint "+id, err)
	}
	if n == 0 {
		return fmt.Errorf("webhook: %s endpoint %s: %w", what, id, ErrEndpointNotFound)
	}
	return nil
}

// RotateKey adds key to the endpoint's ring and lets the keys it had sign
// on for grace, side by side with key, so receivers can switch to the new
// key while deliveries still verify with the old one. A grace of 0 retires
// the old keys at once.
func (r *Registry) RotateKey(ctx context.Context, id, key string, grace time.Duration) error {
	if err := signingKeys([]string{key}); err != nil {
		return err
	}
	if grace < 0 {
		return fmt.Errorf("webhook: rotate key of %s: grace %v is negative", id, grace)
	}
	return pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, r.sql.expireKeys, id, grace.Microseconds()); err != nil {
			return dbError("rotate key of "+id, err)
		}
		_, err := tx.Exec(ctx, r.sql.insertKey, id, key)
		var pgErr interface{ SQLState() string }
		if errors.As(err, &pgErr) && pgErr.SQLState() == "23503" { // foreign_key_violation
			return fmt.Errorf("webhook: rotate key of %s: %w", id, ErrEndpointNotFound)
		}
		return affected(1, err, "rotate key of", id)
	})
}

// Disable stops deliveries to the endpoint, with reason. Its pending rows
// are held in the outbox, neither delivered nor counted as attempts, until
// [Registry.Enable]; fan-out skips it meanwhile. Disabling a disabled
// endpoint keeps the first reason.
func (r *Registry) Disable(ctx context.Context, id, reason string) error {
	if _, err := r.db.Exec(ctx, r.sql.disable, id, reason); err != nil {
		return dbError("disable endpoint "+id, err)
	}
	_, err := r.Get(ctx, id)
	return err
}

// Enable lets deliveries flow to the endpoint again, its held rows first
// (in key order), and restarts its failure clock. The held rows come back
// within the Sink's HoldInterval; to send them at once, call
// Outbox.RetryNow with the destination [DestinationPrefix]+id after Enable.
func (r *Registry) Enable(ctx context.Context, id string) error {
	tag, err := r.db.Exec(ctx, r.sql.enable, id)
	return affected(tag.RowsAffected(), err, "enable", id)
}

// Remove deletes the endpoint and its keys. Rows still pending for it
// become dead letters when the relay reaches them.
func (r *Registry) Remove(ctx context.Context, id string) error {
	tag, err := r.db.Exec(ctx, r.sql.remove, id)
	return affected(tag.RowsAffected(), err, "remove", id)
}

// Get returns one endpoint with its signing keys.
func (r *Registry) Get(ctx context.Context, id string) (Endpoint, error) {
	eps, err := r.List(ctx, id)
	if err != nil {
		return Endpoint{}, err
	}
	if len(eps) == 0 {
		return Endpoint{}, fmt.Errorf("webhook: endpoint %s: %w", id, ErrEndpointNotFound)
	}
	return eps[0], nil
}

// List returns the endpoints of ids, or every endpoint when ids is empty,
// enabled or not, ordered by id. An id the registry does not hold is left
// out, not an error: one read serves a Sink's batch of many endpoints.
func (r *Registry) List(ctx context.Context, ids ...string) ([]Endpoint, error) {
	if len(ids) == 0 {
		ids = nil // NULL: every endpoint
	}
	rows, err := r.db.Query(ctx, r.sql.get, ids)
	if err != nil {
		return nil, dbError("read endpoints", err)
	}
	eps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Endpoint, error) {
		var e Endpoint
		var timeoutMS int64
		var disabled, failing, breakerSince *time.Time
		var breaker, breakerRelay *string
		err := row.Scan(&e.ID, &e.URL, &e.EventTypes, &timeoutMS, &e.Concurrency, &e.RateLimit, &disabled, &e.DisabledReason,
			&failing, &e.CreatedAt, &e.UpdatedAt, &breaker, &breakerSince, &breakerRelay, &e.Keys)
		e.Timeout = time.Duration(timeoutMS) * time.Millisecond
		if disabled != nil {
			e.DisabledAt = *disabled
		}
		if failing != nil {
			e.FailingSince = *failing
		}
		if breaker != nil {
			e.Breaker = BreakerState(*breaker)
		}
		if breakerSince != nil {
			e.BreakerSince = *breakerSince
		}
		if breakerRelay != nil {
			e.BreakerRelay = *breakerRelay
		}
		return e, err
	})
	if err != nil {
		return nil, dbError("read endpoints", err)
	}
	return eps, nil
}

// The calls below are how a delivering Sink (package webhook) reports what
// it saw; they are exported for it, and an operator's tool has no reason
// to call them.

// MarkFailing starts the endpoint's failure clock (Endpoint.FailingSince)
// unless it runs, and returns when it started: the Sink disables the
// endpoint once it has run for its DisableAfter.
func (r *Registry) MarkFailing(ctx context.Context, id string) (time.Time, error) {
	var since time.Time
	if err := r.db.QueryRow(ctx, r.sql.failing, id).Scan(&since); err != nil {
		return time.Time{}, dbError("start the failure clock of endpoint "+id, err)
	}
	return since, nil
}

// MarkSucceeded stops the endpoint's failure clock after a delivery got a
// 2xx.
func (r *Registry) MarkSucceeded(ctx context.Context, id string) error {
	if _, err := r.db.Exec(ctx, r.sql.succeeded, id); err != nil {
		return dbError("stop the failure clock of endpoint "+id, err)
	}
	return nil
}

// ReportBreaker records that the breaker of the Sink named relay changed
// to state at since (Endpoint.Breaker, BreakerSince, BreakerRelay). With
// several relays the last report wins.
func (r *Registry) ReportBreaker(ctx context.Context, id string, state BreakerState, since time.Time, relay string) error {
	if _, err := r.db.Exec(ctx, r.sql.breaker, id, string(state), since, relay); err != nil {
		return dbError("record the breaker of endpoint "+id, err)
	}
	return nil
}
