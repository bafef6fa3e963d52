package requesttest

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/dynamostore"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/redisstore"
	"github.com/idemq/idemq/testenv"
)

// Switchable is a store's server, or the path to it, that a test stops and
// starts again.
type Switchable interface {
	Stop()
	Start()
}

// Kind opens idemq's stores of one kind on testenv's servers, for the
// tests of the front ends that run on every store.
type Kind struct {
	Name string
	// Open returns a store on the shared test server.
	Open func(tb testing.TB) request.Store
	// Outage returns a store whose server (or the path to it) the test
	// stops and starts: a Postgres behind a proxy, a redis-server or a
	// dynalite of the test's own.
	Outage func(tb testing.TB) (request.Store, Switchable)
	// Durable says whether records survive an outage of Outage's server
	// (the test redis-server keeps nothing on disk).
	Durable bool
}

// Kinds are the Postgres, Redis and DynamoDB stores.
var Kinds = []Kind{
	{"postgres", OpenPostgres, postgresOutage, true},
	{"redis", func(tb testing.TB) request.Store {
		rdb, prefix := testenv.Redis(tb)
		return Redis(tb, rdb, prefix)
	}, redisOutage, false},
	{"dynamodb", func(tb testing.TB) request.Store {
		db, table := testenv.DynamoDB(tb)
		return Dynamo(tb, db, table)
	}, dynamoOutage, true},
}

// OpenPostgres returns a migrated pgstore on the test database.
func OpenPostgres(tb testing.TB) request.Store { return Postgres(tb, testenv.PostgresURL(tb)) }

// Postgres returns a migrated pgstore on a pool of its own to connString.
func Postgres(tb testing.TB, connString string) request.Store {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), connString)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	s, err := pgstore.New(pool, pgstore.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s
}

// Redis returns a redisstore on rdb whose keys start with prefix.
func Redis(tb testing.TB, rdb redis.UniversalClient, prefix string) request.Store {
	tb.Helper()
	s, err := redisstore.New(context.Background(), rdb, redisstore.Config{Prefix: prefix})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Dynamo returns a dynamostore on a table it creates.
func Dynamo(tb testing.TB, db dynamostore.API, table string) request.Store {
	tb.Helper()
	s, err := dynamostore.New(db, dynamostore.Config{Table: table})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.CreateTable(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s
}

// postgresOutage reaches Postgres through a proxy: stopped, connections
// are refused.
func postgresOutage(tb testing.TB) (request.Store, Switchable) {
	u, err := url.Parse(testenv.PostgresURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	proxy := testenv.NewProxy(tb, u.Host)
	u.Host = proxy.Addr()
	return Postgres(tb, u.String()), proxy
}

func redisOutage(tb testing.TB) (request.Store, Switchable) {
	srv := testenv.StartRedis(tb)
	return Redis(tb, srv.Client(), ""), srv
}

func dynamoOutage(tb testing.TB) (request.Store, Switchable) {
	srv := testenv.StartDynalite(tb)
	return Dynamo(tb, srv.Client(), "requests"), srv
}
