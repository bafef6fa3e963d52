package endpoints_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook/endpoints"
	"github.com/idemq/idemq/transports/webhook/signing"
)

// bundle is what a test of the registry and the fan-out needs: a fresh
// database with the outbox and the registry migrated.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	ob   *outbox.Outbox
	reg  *endpoints.Registry
	pub  *endpoints.Publisher
}

func setup(t testing.TB) bundle {
	t.Helper()
	b := bundle{ctx: context.Background(), pool: testenv.Postgres(t)}
	var err error
	if b.ob, err = outbox.New(b.pool, outbox.Config{}); err == nil {
		err = b.ob.Migrate(b.ctx)
	}
	if err == nil {
		b.reg, err = endpoints.NewRegistry(b.pool, endpoints.RegistryConfig{})
	}
	if err == nil {
		err = b.reg.Migrate(b.ctx)
	}
	if err == nil {
		b.pub, err = endpoints.NewPublisher(b.reg, b.ob)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// addEndpoint registers an endpoint for url with a fresh secret, changed
// by tweak when not nil.
func addEndpoint(t testing.TB, b bundle, url string, tweak func(*endpoints.Endpoint)) endpoints.Endpoint {
	t.Helper()
	ep := endpoints.Endpoint{URL: url, Keys: []string{signing.NewSecret()}}
	if tweak != nil {
		tweak(&ep)
	}
	ep, err := b.reg.Add(b.ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// publish fans events out in one committed transaction and returns the
// rows written.
func publish(t testing.TB, b bundle, events ...endpoints.Event) int {
	t.Helper()
	var n int
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) (err error) {
		n, err = b.pub.PublishTx(b.ctx, tx, events...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// event returns an event of type "test.event" whose data is {"n": n}.
func event(key string, n int) endpoints.Event {
	return endpoints.Event{Type: "test.event", Key: key, Data: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

// pending counts the outbox rows written.
func pending(t testing.TB, b bundle) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idemq_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
