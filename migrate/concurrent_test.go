package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"testing/fstest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// TestConcurrentMigrationsOfEveryPackage: an inbox, an outbox and two more
// inboxes migrating at the same moment into a fresh database, in the public
// schema and in a schema that does not exist yet, all succeed, 8 rounds
// out of 8. Before one lock covered every migration, the first failed on
// pg_type_typname_nsp_index (two CREATE TABLE IF NOT EXISTS of the
// migration log) and the second on CREATE SCHEMA running before the lock.
func TestConcurrentMigrationsOfEveryPackage(t *testing.T) {
	t.Parallel()
	for round := range 8 {
		for _, schema := range []string{"public", fmt.Sprint("svc", round)} {
			pool, err := pgxpool.New(context.Background(), testenv.PostgresURL(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var migrators []func(context.Context) error
			for _, table := range []string{"", "inbox_b", "inbox_c"} {
				in, err := inbox.New(pool, inbox.Config{Schema: schema, Table: table})
				if err != nil {
					t.Fatal(err)
				}
				migrators = append(migrators, in.Migrate)
			}
			ob, err := outbox.New(pool, outbox.Config{Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			migrators = append(migrators, ob.Migrate)
			errs := make([]error, len(migrators))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, m := range migrators {
				wg.Go(func() {
					<-start
					errs[i] = m(ctx)
				})
			}
			close(start)
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("round %d, schema %s: %v", round, schema, err)
			}
			var applied int
			if err := pool.QueryRow(ctx, `SELECT count(DISTINCT owner) FROM `+schema+`.idemq_migrations`).Scan(&applied); err != nil || applied != 4 {
				t.Fatalf("round %d, schema %s: %d owners in the migration log, want 4 (%v)", round, schema, applied, err)
			}
			pool.Close()
		}
	}
}

// TestMigrationLogNameIsReserved: no store may take the migration log's
// name.
func TestMigrationLogNameIsReserved(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	src := migrate.Source{Component: "mine", Schema: "public", Table: migrate.LogTable, Files: fstest.MapFS{}, Dir: "."}
	if _, err := migrate.New(pool, source(src)).Migrate(context.Background()); !errors.Is(err, idemq.ErrConfig) || !strings.Contains(err.Error(), migrate.LogTable) {
		t.Fatalf("a Source on the table %s: %v, want an idemq.ErrConfig naming it", migrate.LogTable, err)
	}
	if _, err := inbox.New(pool, inbox.Config{Table: "idemq_migrations"}); err == nil {
		t.Error("inbox.New accepted the table idemq_migrations")
	}
	if _, err := outbox.New(pool, outbox.Config{Table: "idemq_migrations"}); err == nil {
		t.Error("outbox.New accepted the table idemq_migrations")
	}
}

// source is a migrate.Store of its own Source.
type source migrate.Source

func (s source) MigrationSource() migrate.Source { return migrate.Source(s) }

// TestImportsNoHeavyLibrary: migrating the inbox compiles no broker,
// Redis, AWS or gRPC library: package migrate imports no store, and the
// inbox imports nothing heavier than package migrate.
func TestImportsNoHeavyLibrary(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/idemq/idemq/migrate", "github.com/idemq/idemq/inbox").CombinedOutput()
	if err != nil {
		t.Fatalf("go list (the go command must be on PATH): %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/jackc/pgx/v5\n") {
		t.Fatalf("go list did not list pgx:\n%s", out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, heavy := range []string{"kafka", "nats-io", "franz-go", "redis", "aws", "grpc", "urfave", "/idemq/outbox", "/idemq/transports", "/idemq/request"} {
			if strings.Contains(dep, heavy) {
				t.Errorf("migrate or inbox depends on %s", dep)
			}
		}
	}
}
