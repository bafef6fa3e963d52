package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/migrate"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/request/pgstore"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/webhook/endpoints"
)

// long is a table name of the most bytes a Config accepts, whose derived
// index names Postgres shortens.
func long(c string) string { return strings.Repeat(c, 48) }

// storeCase is one store with rows to put in its tables.
type storeCase struct {
	name string
	open func(t *testing.T, db migrate.DB) migrate.Store
	// seed inserts rows into the tables of version 1, which stay until
	// the store is undone entirely, given the store's quoted main table.
	seed func(table string) string
}

func inboxCase(schema, table string) storeCase {
	return storeCase{
		name: "inbox " + schema + "." + table,
		open: func(t *testing.T, db migrate.DB) migrate.Store {
			return must(inbox.New(db, inbox.Config{Schema: schema, Table: table}))(t)
		},
		seed: seedInbox,
	}
}

func seedInbox(table string) string {
	scopes := strings.TrimSuffix(table, `"`) + `_scopes"`
	return `INSERT INTO ` + scopes + ` (name) VALUES ('orders');
INSERT INTO ` + table + ` (expires_at, key_id, scope_id, status, fingerprint)
SELECT now() + interval '1 day', gen_random_uuid(), 1, 1, '\x01' FROM generate_series(1, 100)`
}

// stores is every store, with default names and with long names in a
// schema of their own.
func stores() []storeCase {
	var cases []storeCase
	for _, names := range []struct{ schema, inbox, outbox, webhook, requests, partitioned string }{
		{inbox.SchemaDefault, inbox.TableDefault, outbox.TableDefault, endpoints.TableDefault, pgstore.TableDefault, "idemq_inbox_pa"},
		{"app", long("i"), long("o"), long("w"), long("r"), long("p")},
	} {
		cases = append(cases,
			inboxCase(names.schema, names.inbox),
			storeCase{
				name: "outbox " + names.schema + "." + names.outbox,
				open: func(t *testing.T, db migrate.DB) migrate.Store {
					return must(outbox.New(db, outbox.Config{Schema: names.schema, Table: names.outbox}))(t)
				},
				seed: func(table string) string {
					dead := strings.TrimSuffix(table, `"`) + `_dead"`
					return `INSERT INTO ` + table + ` (id, destination, payload, key)
SELECT gen_random_uuid(), 'orders', '\x01', 'k' || (i % 7) FROM generate_series(1, 100) AS i;
INSERT INTO ` + dead + ` (seq, id, created_at, attempts, destination, payload, last_error)
VALUES (1000, gen_random_uuid(), now(), 3, 'orders', '\x01', 'boom')`
				},
			},
			storeCase{
				name: "webhook " + names.schema + "." + names.webhook,
				open: func(t *testing.T, db migrate.DB) migrate.Store {
					return must(endpoints.NewRegistry(db, endpoints.RegistryConfig{Schema: names.schema, Table: names.webhook}))(t)
				},
				seed: func(table string) string {
					keys := strings.TrimSuffix(table, `"`) + `_keys"`
					return `INSERT INTO ` + table + ` (id, url) VALUES ('a', 'https://a.example'), ('b', 'https://b.example');
INSERT INTO ` + keys + ` (endpoint_id, secret) VALUES ('a', 'whsec_x'), ('b', 'whsec_y')`
				},
			},
			storeCase{
				name: "pgstore " + names.schema + "." + names.requests,
				open: func(t *testing.T, db migrate.DB) migrate.Store {
					return must(pgstore.New(db, pgstore.Config{Schema: names.schema, Table: names.requests}))(t)
				},
				seed: seedInbox,
			},
			storeCase{
				name: "inbox partitioned " + names.schema + "." + names.partitioned,
				open: func(t *testing.T, db migrate.DB) migrate.Store {
					cfg := inbox.Config{Schema: names.schema, Table: names.partitioned, Partitioning: inbox.PartitionByArrival}
					return must(inbox.New(db, cfg))(t)
				},
				// Rows from before partitioning, in bucket 0.
				seed: func(table string) string {
					return strings.Replace(strings.Replace(seedInbox(table), "(expires_at,", "(bucket, expires_at,", 1), "SELECT now()", "SELECT 0, now()", 1)
				},
			},
		)
	}
	return cases
}

// must returns v, or fails t with err.
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// mainTable returns the quoted main table of s.
func mainTable(s migrate.Store) string {
	src := s.MigrationSource()
	return pgx.Identifier{src.Schema, src.Table}.Sanitize()
}

// TestDownAndUpAgainKeepRows: for every store, with default names and with
// 48-byte names whose index names Postgres shortens, on tables that hold
// rows: undoing the last k migrations and applying them again, for every
// k, gives back the schema Migrate built, and the rows of the tables that
// stayed are all there. Undoing everything drops every table but the log.
func TestDownAndUpAgainKeepRows(t *testing.T) {
	t.Parallel()
	for _, c := range stores() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.Postgres(t)
			store := c.open(t, pool)
			m := migrate.New(pool, store)
			applied, err := m.Migrate(ctx)
			if err != nil || len(applied) == 0 {
				t.Fatalf("Migrate: %v, %v", applied, err)
			}
			want := schema(t, pool)
			table := mainTable(store)
			if _, err := pool.Exec(ctx, c.seed(table)); err != nil {
				t.Fatal(err)
			}
			rows := count(t, pool, `SELECT count(*) FROM `+table)
			latest := applied[len(applied)-1].Version
			for to := latest - 1; to >= 0; to-- {
				undone, err := m.Down(ctx, to)
				if err != nil || len(undone) != latest-to || undone[0].Version != latest || undone[len(undone)-1].Version != to+1 {
					t.Fatalf("Down(%d): %v, %v; want versions %d down to %d", to, undone, err, latest, to+1)
				}
				if err := m.Validate(ctx); !errors.Is(err, migrate.ErrPending) {
					t.Fatalf("Validate after Down(%d): %v, want ErrPending", to, err)
				}
				if to == 0 {
					if left := tables(t, pool); !slices.Equal(left, []string{migrate.LogTable}) {
						t.Fatalf("after Down(0) the tables %v are left, want only the log", left)
					}
				} else if got := count(t, pool, `SELECT count(*) FROM `+table); got != rows {
					t.Fatalf("after Down(%d): %d rows, want the %d seeded", to, got, rows)
				}
				if again, err := m.Migrate(ctx); err != nil || len(again) != latest-to {
					t.Fatalf("Migrate after Down(%d): %v, %v", to, again, err)
				}
				if got := schema(t, pool); !slices.Equal(got, want) {
					t.Fatalf("schema after Down(%d) and Migrate differs from Migrate's:\n%s", to, diff(want, got))
				}
				if to > 0 {
					if got := count(t, pool, `SELECT count(*) FROM `+table); got != rows {
						t.Fatalf("after Down(%d) and Migrate: %d rows, want %d", to, got, rows)
					}
				}
			}
		})
	}
}

// TestExportAppliesLikeMigrate: in every format, the files Export writes
// for every store, applied in name order by plain Exec on an empty
// database (no idemq code involved), build the schema Migrate builds, the
// migration log included, so Validate finds nothing pending; the downs in
// reverse order leave what Down(0) leaves. A second Export into the
// directory adds nothing, and an Export after stores were added numbers
// their files after the others.
func TestExportAppliesLikeMigrate(t *testing.T) {
	t.Parallel()
	for _, f := range []struct {
		format   migrate.Format
		perStep  int
		sections func(t *testing.T, dir string) (ups, downs []string)
	}{
		{migrate.GolangMigrate, 2, func(t *testing.T, dir string) ([]string, []string) {
			return readAll(t, dir, "*.up.sql"), readAll(t, dir, "*.down.sql")
		}},
		{migrate.Flyway, 2, func(t *testing.T, dir string) ([]string, []string) {
			return readAll(t, dir, "V*.sql"), readAll(t, dir, "U*.sql")
		}},
		{migrate.Goose, 1, func(t *testing.T, dir string) (ups, downs []string) {
			for _, sql := range readAll(t, dir, "*.sql") {
				up, down, ok := strings.Cut(sql, "\n-- +goose Down\n")
				if !ok || !strings.Contains(up, "\n-- +goose Up\n") {
					t.Fatalf("a goose file without its annotations:\n%s", sql)
				}
				ups, downs = append(ups, up), append(downs, down)
			}
			return ups, downs
		}},
	} {
		t.Run(string(f.format), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			migrated, exported := testenv.Postgres(t), testenv.Postgres(t)
			var all []migrate.Store
			for _, c := range stores() {
				all = append(all, c.open(t, migrated))
			}
			applied, err := migrate.New(migrated, all...).Migrate(ctx)
			if err != nil {
				t.Fatal(err)
			}

			dir := t.TempDir()
			steps := len(must(migrate.New(exported, all[:3]...).List(ctx))(t)) // of the first three stores
			first, err := migrate.New(exported, all[:3]...).Export(dir, f.format)
			if err != nil {
				t.Fatal(err)
			}
			files, err := migrate.New(exported, all...).Export(dir, f.format)
			if err != nil {
				t.Fatal(err)
			}
			if len(first) != steps*f.perStep || !strings.Contains(files[0], fmt.Sprintf("%04d_", steps+1)) || len(first)+len(files) != len(applied)*f.perStep {
				t.Fatalf("Export wrote %v, then %v; want the files of the first three stores (0001 to %04d), then only the rest", first, files, steps)
			}
			if again, err := migrate.New(exported, all...).Export(dir, f.format); err != nil || len(again) != 0 {
				t.Fatalf("a second Export wrote %v, %v; want nothing", again, err)
			}

			ups, downs := f.sections(t, dir)
			if len(ups) != len(applied) || len(downs) != len(applied) {
				t.Fatalf("%d ups and %d downs exported, want %d each", len(ups), len(downs), len(applied))
			}
			for _, sql := range ups {
				if _, err := exported.Exec(ctx, sql); err != nil {
					t.Fatalf("%v:\n%s", err, sql)
				}
			}
			if got, want := schema(t, exported), schema(t, migrated); !slices.Equal(got, want) {
				t.Fatalf("the exported files build another schema than Migrate:\n%s", diff(want, got))
			}
			if err := migrate.New(exported, all...).Validate(ctx); err != nil {
				t.Fatalf("Validate after the exported files: %v", err)
			}
			for _, sql := range slices.Backward(downs) {
				if _, err := exported.Exec(ctx, sql); err != nil {
					t.Fatalf("%v:\n%s", err, sql)
				}
			}
			if _, err := migrate.New(migrated, all...).Down(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if got, want := schema(t, exported), schema(t, migrated); !slices.Equal(got, want) {
				t.Fatalf("the exported downs leave another schema than Down(0):\n%s", diff(want, got))
			}
		})
	}
	// Export needs no database: a pool that never connects will do.
	nowhere := must(pgxpool.New(context.Background(), "postgres://127.0.0.1:1/none"))(t)
	defer nowhere.Close()
	m := migrate.New(nowhere, must(inbox.New(nowhere, inbox.Config{}))(t))
	if files, err := m.Export(t.TempDir(), ""); err != nil || len(files) != 14 || files[0] != "0001_idemq_inbox_inbox.up.sql" {
		t.Errorf("Export in the zero Format: %v, %v; want golang-migrate's files", files, err)
	}
	if _, err := m.Export(t.TempDir(), "atlas"); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("Export in an unknown format: %v, want idemq.ErrConfig", err)
	}
}

// TestListValidateAndUnknownVersions: List shows every migration with
// AppliedAt set once applied; Validate fails with the pending ones and
// passes once they are applied; a version in the log that the store does
// not know (a newer idemq applied it) is listed, does not fail Validate,
// and makes Down refuse rather than guess.
func TestListValidateAndUnknownVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ib := must(inbox.New(pool, inbox.Config{}))(t)
	ob := must(outbox.New(pool, outbox.Config{Schema: "other"}))(t)
	m := migrate.New(pool, ob, ib, ib)

	err := m.Validate(ctx)
	var pending *migrate.PendingError
	if !errors.As(err, &pending) || ids(pending.Pending) != fileIDs(t, ob.MigrationSource())+" inbox:0001_inbox inbox:0002_failures inbox:0003_conflicts inbox:0004_superseded inbox:0005_token inbox:0006_error_class inbox:0007_expired_leases" {
		t.Fatalf("Validate on an empty database: %v", err)
	}
	if list := must(m.List(ctx))(t); ids(list) != ids(pending.Pending) || !list[0].AppliedAt.IsZero() || !strings.Contains(list[0].Up, `CREATE TABLE "other"."idemq_outbox"`) {
		t.Fatalf("List before Migrate: %+v", list)
	}
	if _, err := m.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(ctx); err != nil {
		t.Fatalf("Validate after Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO idemq_migrations (owner, version, name) VALUES ('inbox:public.idemq_inbox', 8, 'future')`); err != nil {
		t.Fatal(err)
	}
	list := must(m.List(ctx))(t)
	if last := list[len(list)-1]; ids(list) != ids(pending.Pending)+" inbox:0008_future" || last.AppliedAt.IsZero() || last.Up != "" ||
		slices.ContainsFunc(list, func(mg migrate.Migration) bool { return mg.AppliedAt.IsZero() }) {
		t.Fatalf("List with a newer version applied: %+v", list)
	}
	if err := m.Validate(ctx); err != nil {
		t.Fatalf("Validate with a newer version applied: %v", err)
	}
	if _, err := m.Down(ctx, 0); err == nil || !strings.Contains(err.Error(), "does not know") {
		t.Fatalf("Down over an unknown version: %v", err)
	}
	if _, err := m.Down(ctx, -1); err == nil {
		t.Fatal("Down(-1) was accepted")
	}
}

// TestStoresPendingMigrations: each store's PendingMigrations lists its
// migrations until its Migrate applied them.
func TestStoresPendingMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	ob := must(outbox.New(pool, outbox.Config{}))(t)
	type pender interface {
		migrate.Store
		Migrate(context.Context) error
		PendingMigrations(context.Context) ([]migrate.Migration, error)
	}
	for _, c := range []struct {
		store pender
		want  string
	}{
		{must(inbox.New(pool, inbox.Config{}))(t), "inbox:0001_inbox inbox:0002_failures inbox:0003_conflicts inbox:0004_superseded inbox:0005_token inbox:0006_error_class inbox:0007_expired_leases"},
		{ob, fileIDs(t, ob.MigrationSource())},
		{must(endpoints.NewRegistry(pool, endpoints.RegistryConfig{}))(t), "webhook:0001_endpoints webhook:0002_breaker"},
		{must(pgstore.New(pool, pgstore.Config{}))(t), "inbox:0001_inbox inbox:0002_failures inbox:0003_conflicts inbox:0004_superseded inbox:0005_token inbox:0006_error_class inbox:0007_expired_leases"},
	} {
		if pending, err := c.store.PendingMigrations(ctx); err != nil || ids(pending) != c.want {
			t.Fatalf("%T before Migrate: %v, %v; want %s", c.store, ids(pending), err, c.want)
		}
		if err := c.store.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if pending, err := c.store.PendingMigrations(ctx); err != nil || len(pending) != 0 {
			t.Fatalf("%T after Migrate: %v, %v", c.store, ids(pending), err)
		}
	}
}

// fileIDs lists the migrations of src as ids does, from its up files:
// the outbox's list grows with every migration it gains.
func fileIDs(t *testing.T, src migrate.Source) string {
	t.Helper()
	ups, err := fs.Glob(src.Files, src.Dir+"/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range ups {
		out = append(out, src.Component+":"+strings.TrimSuffix(path.Base(f), ".up.sql"))
	}
	return strings.Join(out, " ")
}

func ids(ms []migrate.Migration) string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Component+":"+m.ID())
	}
	return strings.Join(out, " ")
}

// schema describes the tables of every schema but the system ones, the
// migration log's rows included: columns in order with type, nullability,
// default, collation and identity; indexes; constraints; storage
// parameters; sequences.
func schema(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	const user = `NOT IN ('pg_catalog', 'information_schema', 'pg_toast')`
	rows, err := pool.Query(context.Background(), `
SELECT format('column %s.%s #%s %s %s %s null=%s default=%s collation=%s identity=%s',
    table_schema, table_name, row_number() OVER (PARTITION BY table_schema, table_name ORDER BY ordinal_position),
    column_name, data_type, udt_name, is_nullable, column_default, collation_name, identity_generation)
FROM information_schema.columns WHERE table_schema `+user+`
UNION ALL SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname `+user+`
UNION ALL SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
FROM pg_constraint WHERE connamespace::regnamespace::text `+user+`
UNION ALL SELECT format('options %s %s', oid::regclass, reloptions) FROM pg_class
WHERE relnamespace::regnamespace::text `+user+` AND reloptions IS NOT NULL
UNION ALL SELECT format('sequence %s.%s %s %s %s', schemaname, sequencename, data_type, increment_by, cache_size)
FROM pg_sequences WHERE schemaname `+user+`
UNION ALL SELECT format('log %s.%s', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'idemq_migrations' AND c.relkind = 'r'`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Clone(out) {
		if log, ok := strings.CutPrefix(s, "log "); ok {
			out = append(out, logRows(t, pool, log)...)
		}
	}
	slices.Sort(out)
	return out
}

func logRows(t *testing.T, pool *pgxpool.Pool, log string) []string {
	rows, err := pool.Query(context.Background(), `SELECT format('applied %s %s %s', owner, version, name) FROM `+log)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tables lists the tables of the database's user schemas, by name.
func tables(t *testing.T, pool *pgxpool.Pool) []string {
	rows, err := pool.Query(context.Background(), `SELECT DISTINCT tablename FROM pg_tables
WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	return must(pgx.CollectRows(rows, pgx.RowTo[string]))(t)
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// diff lists the lines only in want and only in got.
func diff(want, got []string) string {
	var b strings.Builder
	for _, w := range want {
		if !slices.Contains(got, w) {
			fmt.Fprintf(&b, "- %s\n", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			fmt.Fprintf(&b, "+ %s\n", g)
		}
	}
	return b.String()
}

// readAll returns the contents of the files in dir that match pattern, by
// name.
func readAll(t *testing.T, dir, pattern string) []string {
	var out []string
	for _, name := range must(filepath.Glob(filepath.Join(dir, pattern)))(t) {
		out = append(out, string(must(os.ReadFile(name))(t)))
	}
	return out
}
