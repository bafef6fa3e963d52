package migrate_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/testenv"
)

// The bad-input suite of the migrator (issue 23): a careless argument gets
// an idemq.ErrConfig naming it, never a panic.

// TestBadInputNilDBAndStoresAreRefused: a nil db, or a typed nil such as
// (*pgxpool.Pool)(nil), is refused by the methods that need the database
// while Export still works without one; a nil or typed-nil store is
// refused by every method.
func TestBadInputNilDBAndStoresAreRefused(t *testing.T) {
	pool := testenv.Postgres(t)
	store, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	field := func(err error) string {
		if ce, ok := errors.AsType[*idemq.ConfigError](err); ok && errors.Is(err, idemq.ErrConfig) {
			return ce.Field
		}
		return ""
	}
	var typedPool *pgxpool.Pool
	for name, db := range map[string]migrate.DB{"nil": nil, "typed nil": typedPool} {
		m := migrate.New(db, store)
		if _, err := m.Migrate(ctx); field(err) != "db" {
			t.Errorf("Migrate with a %s db: %v, want an ErrConfig for db", name, err)
		}
		if _, err := m.List(ctx); field(err) != "db" {
			t.Errorf("List with a %s db: %v, want an ErrConfig for db", name, err)
		}
		if _, err := m.Export(t.TempDir(), migrate.Goose); err != nil {
			t.Errorf("Export with a %s db: %v, want it to work without a database", name, err)
		}
	}
	var typedStore *inbox.Store
	for name, st := range map[string]migrate.Store{"nil": nil, "typed nil": typedStore} {
		m := migrate.New(pool, store, st)
		if _, err := m.Migrate(ctx); field(err) != "stores[1]" {
			t.Errorf("Migrate with a %s store: %v, want an ErrConfig for stores[1]", name, err)
		}
		if _, err := m.Export(t.TempDir(), migrate.Goose); field(err) != "stores[1]" {
			t.Errorf("Export with a %s store: %v, want an ErrConfig for stores[1]", name, err)
		}
	}
}
