package fleet_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
)

func TestCheckRefusesWhatWouldBeCountedTwice(t *testing.T) {
	t.Parallel()
	a := fleet.Database{Name: "a", ConnString: "postgres://u@db1:5432/shop_a"}
	for name, dbs := range map[string][]fleet.Database{
		"empty name":      {{Name: "", ConnString: a.ConnString}},
		"blank name":      {{Name: " a", ConnString: a.ConnString}},
		"name twice":      {a, {Name: "a", ConnString: "postgres://u@db1:5432/shop_b"}},
		"database twice":  {a, {Name: "b", ConnString: "host=db1 port=5432 user=v dbname=shop_a"}},
		"bad conn string": {{Name: "a", ConnString: "postgres://u@db1:notaport/x"}},
	} {
		if _, err := fleet.Check(dbs); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("%s: got %v, want an idemq.ErrConfig", name, err)
		}
	}
	ok := []fleet.Database{a, {Name: "b", ConnString: "postgres://u@db1:5432/shop_b"}, {Name: "c", ConnString: "postgres://u@db2:5432/shop_a"}}
	if _, err := fleet.Check(ok); err != nil {
		t.Errorf("two databases on one server and one of the same name on another: %v", err)
	}
}

func TestFileSource(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dbs")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src := fleet.File(path)
	write("# tenants\n\nacme postgres://u@db1/acme\nglobex\thost=db2 dbname=globex user=u\n")
	dbs, err := src.Databases(context.Background())
	if err != nil || len(dbs) != 2 || dbs[1].Name != "globex" || dbs[1].ConnString != "host=db2 dbname=globex user=u" {
		t.Fatalf("got %v, %v", dbs, err)
	}
	write("acme\n")
	if _, err := src.Databases(context.Background()); err == nil || !strings.Contains(err.Error(), ":1: want NAME CONNSTRING") {
		t.Errorf("a line without a connection string: %v", err)
	}
	if _, err := fleet.File(filepath.Join(t.TempDir(), "none")).Databases(context.Background()); err == nil {
		t.Error("a missing file gave no error")
	}
}

func TestQuerySource(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE tenants (id text, dsn text, active bool);
		INSERT INTO tenants VALUES ('a', 'postgres://u@db1/a', true), ('b', 'postgres://u@db1/b', false)`); err != nil {
		t.Fatal(err)
	}
	dbs, err := fleet.Query(pool, `SELECT id, dsn FROM tenants WHERE active`).Databases(ctx)
	if err != nil || len(dbs) != 1 || dbs[0].Name != "a" {
		t.Fatalf("got %v, %v", dbs, err)
	}
	if _, err := fleet.Query(pool, `SELECT id FROM tenants`).Databases(ctx); err == nil {
		t.Error("rows of one column gave no error")
	}
}

func TestBudget(t *testing.T) {
	t.Parallel()
	if _, err := fleet.NewBudget(0); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("a budget of 0: %v", err)
	}
	b, err := fleet.NewBudget(5)
	if err != nil {
		t.Fatal(err)
	}
	if !b.TryReserve("s1", 4) || b.TryReserve("s1", 2) || !b.TryReserve("s2", 5) || !b.TryReserve("s1", 1) {
		t.Error("reservations do not follow the budget per server")
	}
	b.Release("s1", 4)
	if b.InUse("s1") != 1 || b.InUse("s2") != 5 {
		t.Errorf("in use: s1 %d, s2 %d", b.InUse("s1"), b.InUse("s2"))
	}
}

// TestWatcherSeesInserts reads the statistics of a server: a database is
// reported the first time, then again only after rows were inserted in it.
func TestWatcherSeesInserts(t *testing.T) {
	t.Parallel()
	a := fleet.Database{Name: "a", ConnString: testenv.PostgresURL(t)}
	b := fleet.Database{Name: "b", ConnString: testenv.PostgresURL(t)}
	server, err := a.Server()
	if err != nil {
		t.Fatal(err)
	}
	w := fleet.NewWatcher(server)
	defer w.Close()
	ctx := context.Background()
	changed, err := w.Changed(ctx, []fleet.Database{a, b})
	if err != nil || len(changed) != 2 {
		t.Fatalf("first look: %v, %v", changed, err)
	}
	conn, err := pgx.Connect(ctx, b.ConnString)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 10)`); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx) // a session's counts are published when it ends, at the latest
	idemqtest.WaitFor(t, "the inserts into b seen", func() bool {
		changed, err = w.Changed(ctx, []fleet.Database{a, b})
		return err == nil && len(changed) == 1 && changed[0].Name == "b"
	})
}

func TestEachGoesOnPastAFailure(t *testing.T) {
	t.Parallel()
	good := fleet.Database{Name: "good", ConnString: testenv.PostgresURL(t)}
	gone := fleet.Database{Name: "gone", ConnString: strings.Replace(good.ConnString, "/idemq_test_", "/idemq_never_", 1)}
	results := fleet.Each(context.Background(), []fleet.Database{gone, good, gone}, 2, func(ctx context.Context, _ fleet.Database, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `SELECT 1`)
		return err
	})
	if results[0].Err == nil || results[1].Err != nil || results[2].Err == nil || results[1].Database.Name != "good" {
		t.Errorf("results: %+v", results)
	}
}
