package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/request"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/request/requesttest"
	"github.com/idemq/idemq/testenv"
)

func newStore(t testing.TB, pool *pgxpool.Pool, ttl time.Duration) *pgstore.Store {
	return newStoreWith(t, pool, pgstore.Config{RecordTTL: ttl})
}

func newStoreWith(t testing.TB, pool *pgxpool.Pool, cfg pgstore.Config) *pgstore.Store {
	s, err := pgstore.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	requesttest.Run(t, requesttest.Harness{
		New:     func(t *testing.T, ttl time.Duration) request.Store { return newStore(t, testenv.Postgres(t), ttl) },
		Collect: collect,
	})
}

func collect(ctx context.Context, s request.Store) error {
	_, err := s.(*pgstore.Store).GC(ctx, 0)
	return err
}

// TestConformanceSynchronousClaims: the suite with claims that wait for
// their WAL flush, as they did before claims became asynchronous.
func TestConformanceSynchronousClaims(t *testing.T) {
	requesttest.Run(t, requesttest.Harness{
		New: func(t *testing.T, ttl time.Duration) request.Store {
			return newStoreWith(t, testenv.Postgres(t), pgstore.Config{RecordTTL: ttl, SynchronousClaims: true})
		},
		Collect: collect,
	})
}
