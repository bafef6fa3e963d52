package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/nilcheck"
)

// Route names the database of a message's tenant, one of the names its
// [fleet.Source] lists: from a header, the key or the payload. An error
// makes the message a dead letter.
type Route func(msg *Message) (database string, err error)

// RoutedConfig configures a consumer routed across many databases
// ([NewRouted]).
type RoutedConfig struct {
	// Config configures the consumer of each database.
	Config
	// Pools sizes the tenants' pools and the connection budget of each
	// server (fleet.PoolsConfig's defaults: 20 per server, 4 per tenant).
	Pools fleet.PoolsConfig
}

// NewRouted returns a transactional Consumer that applies each message in
// the database of its tenant: route names the database among those src
// lists, and the handler runs in the transaction that records the message
// in that database's inbox, with that database's writes. One broker
// subscription serves every tenant: pass the Consumer to any subscriber.
//
// Pools are opened on a tenant's first message, within the budget of its
// server (fleet.Pools): a message whose tenant the Source does not list,
// even read again, is a dead letter (fleet.ErrUnknown); one that finds
// its server's connections all in use is Retry. ProcessBatch splits a
// batch by database and keeps each message's place. Each database needs
// the inbox migrated ([Consumer.Migrate] migrates them all).
// [Consumer.Store] is nil: the inbox of one tenant is
// [Consumer.Tenant]'s. The DeadLetter hook is not called for a message
// without a tenant: there is no database to call it in.
func NewRouted(src fleet.Source, route Route, scope string, handler Handler, cfg RoutedConfig) (*Consumer, error) {
	switch {
	case nilcheck.IsNil(src):
		return nil, idemq.NewConfigError(component, "source", "is nil")
	case route == nil:
		return nil, idemq.NewConfigError(component, "route", "is nil")
	case handler == nil:
		return nil, idemq.NewConfigError(component, "handler", "is nil")
	}
	if scope == "" || len(scope) > maxScope {
		return nil, idemq.NewConfigError(component, "scope", "must be 1 to %d bytes, got %d", maxScope, len(scope))
	}
	cfg.Config = cfg.Config.withDefaults()
	if err := cfg.Config.validate(); err != nil {
		return nil, err
	}
	// The routed consumer checks keys with the inbox's rules and leaves
	// every statement to its tenants' consumers.
	store, err := inbox.New(noDatabase{}, cfg.Inbox)
	if err != nil {
		return nil, err
	}
	c := &Consumer{scope: scope, claims: (*inboxsql.Store)(store), handler: handler, cfg: cfg.Config}
	pools, err := fleet.NewPools(src, cfg.Pools, func(db fleet.Database, pool *pgxpool.Pool) (*Consumer, error) {
		tcfg := cfg.Config
		tcfg.Logger = tcfg.Logger.With("database", db.Name)
		return New(pool, scope, handler, tcfg)
	})
	if err != nil {
		return nil, err
	}
	c.tenants = &tenants{route: route, pools: pools}
	return c, nil
}

// tenants is the routing state of a consumer made by NewRouted.
type tenants struct {
	route Route
	pools *fleet.Pools[*Consumer]
}

// process applies msg in its tenant's database.
func (t *tenants) process(ctx context.Context, c *Consumer, msg *Message) Result {
	db, res, ok := t.resolve(ctx, c, msg)
	if !ok {
		return res
	}
	tc, release, err := t.pools.Get(ctx, db)
	if err != nil {
		return t.unreachable(ctx, c, msg, err)
	}
	defer release()
	return tc.Process(ctx, msg)
}

// processBatch splits msgs by database, applies each part with
// ProcessBatch, one database at a time, and puts every result in its
// message's place.
func (t *tenants) processBatch(ctx context.Context, c *Consumer, msgs []*Message) []Result {
	results := make([]Result, len(msgs))
	type part struct {
		db   string
		idx  []int
		msgs []*Message
	}
	var parts []*part
	byDB := map[string]*part{}
	for i, msg := range msgs {
		db, res, ok := t.resolve(ctx, c, msg)
		if !ok {
			results[i] = res
			continue
		}
		p := byDB[db]
		if p == nil {
			p = &part{db: db}
			byDB[db] = p
			parts = append(parts, p)
		}
		p.idx, p.msgs = append(p.idx, i), append(p.msgs, msg)
	}
	for _, p := range parts {
		tc, release, err := t.pools.Get(ctx, p.db)
		if err != nil {
			for j, msg := range p.msgs {
				results[p.idx[j]] = t.unreachable(ctx, c, msg, err)
			}
			continue
		}
		for j, r := range tc.ProcessBatch(ctx, p.msgs) {
			results[p.idx[j]] = r
		}
		release()
	}
	return results
}

// resolve returns the name of msg's tenant database, or the result of a
// message that has none.
func (t *tenants) resolve(ctx context.Context, c *Consumer, msg *Message) (string, Result, bool) {
	var name string
	err := guard("Route", func() (err error) {
		if msg == nil {
			return fmt.Errorf("%w: nil message", ErrInvalidMessage)
		}
		name, err = t.route(msg)
		return err
	})
	if err != nil {
		return "", c.finish(ctx, time.Now(), Result{Outcome: DeadLettered, Key: msgID(msg), Err: fmt.Errorf("%w: route: %w", ErrInvalidMessage, err)}), false
	}
	return name, Result{}, true
}

// unreachable is the result of a message whose tenant's consumer could
// not be had: a dead letter for a database the fleet does not list, a
// Retry otherwise (the Source or the budget failed).
func (t *tenants) unreachable(ctx context.Context, c *Consumer, msg *Message, err error) Result {
	if errors.Is(err, fleet.ErrUnknown) {
		return c.finish(ctx, time.Now(), Result{Outcome: DeadLettered, Key: msgID(msg), Err: err})
	}
	return c.finish(ctx, time.Now(), unavailable(msgID(msg), err))
}

func msgID(msg *Message) string {
	if msg == nil {
		return ""
	}
	return msg.ID
}

// migrate migrates the inbox of every database of the Source, four at a
// time, and reports every failure.
func (t *tenants) migrate(ctx context.Context, c *Consumer) error {
	return t.pools.Each(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		store, err := inbox.New(conn, c.cfg.Inbox)
		if err != nil {
			return err
		}
		return store.Migrate(ctx)
	})
}

// Tenant returns the Consumer of one database of a routed consumer (its
// inbox, for administration), opening its pool; nil with an error when
// c is not routed or the Source does not list database.
func (c *Consumer) Tenant(ctx context.Context, database string) (*Consumer, error) {
	if c.tenants == nil {
		return nil, idemq.NewConfigError(component, "Tenant", "the consumer is not routed (see NewRouted)")
	}
	tc, release, err := c.tenants.pools.Get(ctx, database)
	if err != nil {
		return nil, err
	}
	release()
	return tc, nil
}

// noDatabase is the handle of a routed consumer's template, which only
// checks keys: every statement fails.
type noDatabase struct{}

var errNoDatabase = errors.New("consumer: a routed consumer's statements go to its tenants' databases")

func (noDatabase) Begin(context.Context) (pgx.Tx, error) { return nil, errNoDatabase }
func (noDatabase) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNoDatabase
}
func (noDatabase) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errNoDatabase }
func (noDatabase) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return errNoDatabase }
