package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
)

// tenantsChildEnv carries the source file and the queue database to the
// consumer processes of TestRoutedConsumerKilled.
const tenantsChildEnv = "IDEMQ_CONSUMER_TENANTS_CHILD"

// tenantDatabases creates n databases, each with an effects table without
// a unique constraint (an effect applied twice shows as two rows), and
// writes them to a source file.
func tenantDatabases(t *testing.T, n int) (dbs []fleet.Database, file string) {
	t.Helper()
	var list strings.Builder
	for i := range n {
		d := fleet.Database{Name: fmt.Sprintf("tenant-%02d", i), ConnString: testenv.PostgresURL(t)}
		exec1(t, d.ConnString, `CREATE TABLE effects (key text NOT NULL, tenant text NOT NULL)`)
		dbs = append(dbs, d)
		fmt.Fprintf(&list, "%s %s\n", d.Name, d.ConnString)
	}
	file = filepath.Join(t.TempDir(), "tenants")
	if err := os.WriteFile(file, []byte(list.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return dbs, file
}

func exec1(t testing.TB, connString, sql string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// routedConsumer is the consumer of the tests: the tenant header names the
// database, and the handler records the effect there.
func routedConsumer(t testing.TB, src fleet.Source, cfg consumer.RoutedConfig) *consumer.Consumer {
	t.Helper()
	c, err := consumer.NewRouted(src, func(m *consumer.Message) (string, error) {
		if m.Headers["tenant"] == "" {
			return "", errors.New("no tenant header")
		}
		return m.Headers["tenant"], nil
	}, "billing", func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (key, tenant) VALUES ($1, $2)`, m.ID, m.Headers["tenant"])
		return err
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// assertEffects checks that each database holds exactly one effect of each
// of its own messages and none of another tenant's.
func assertEffects(t *testing.T, dbs []fleet.Database, perTenant map[string][]string) {
	t.Helper()
	for _, d := range dbs {
		pool, err := pgxpool.New(context.Background(), d.ConnString)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(context.Background(), `SELECT key, tenant, count(*) FROM effects GROUP BY key, tenant`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		var key, tenant string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&key, &tenant, &n}, func() error {
			if tenant != d.Name {
				t.Errorf("%s holds the effect of %s, a message of %s", d.Name, key, tenant)
			}
			got[key] = n
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		for _, k := range perTenant[d.Name] {
			if got[k] != 1 {
				t.Errorf("%s: %s applied %d times", d.Name, k, got[k])
			}
		}
		if len(got) != len(perTenant[d.Name]) {
			t.Errorf("%s: %d messages applied, want %d", d.Name, len(got), len(perTenant[d.Name]))
		}
	}
}

// TestRoutedConsumer applies messages of four tenants, with duplicates, in
// batches and one by one, through a budget that fits two tenants' pools:
// each effect is applied once, in its tenant's database; a message without
// a tenant and one of an unknown tenant are dead letters at once; a tenant
// added to the source file is served without a restart.
func TestRoutedConsumer(t *testing.T) {
	t.Parallel()
	dbs, file := tenantDatabases(t, 5)
	listed := dbs[:4]
	var list strings.Builder
	for _, d := range listed {
		fmt.Fprintf(&list, "%s %s\n", d.Name, d.ConnString)
	}
	if err := os.WriteFile(file, []byte(list.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := routedConsumer(t, fleet.File(file), consumer.RoutedConfig{Pools: fleet.PoolsConfig{ConnsPerServer: 4, ConnsPerDatabase: 2, Reload: time.Millisecond}})
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	perTenant := map[string][]string{}
	var msgs []*consumer.Message
	for i := range 40 {
		tenant := listed[i%4].Name
		id := fmt.Sprintf("m-%02d", i)
		perTenant[tenant] = append(perTenant[tenant], id)
		m := &consumer.Message{ID: id, Payload: []byte(id), Headers: map[string]string{"tenant": tenant}}
		msgs = append(msgs, m, m) // every message twice
	}
	for i, r := range c.ProcessBatch(ctx, msgs[:40]) {
		if !r.Settled() {
			t.Errorf("batch message %d: %v", i, r)
		}
	}
	for _, m := range msgs[40:] {
		if r := c.Process(ctx, m); !r.Settled() {
			t.Errorf("%s: %v", m.ID, r)
		}
	}
	if r := c.Process(ctx, &consumer.Message{ID: "x", Payload: []byte("x")}); r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrInvalidMessage) {
		t.Errorf("no tenant header: %v", r)
	}
	r := c.Process(ctx, &consumer.Message{ID: "y", Payload: []byte("y"), Headers: map[string]string{"tenant": dbs[4].Name}})
	if r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, fleet.ErrUnknown) {
		t.Errorf("a tenant the source does not list: %v", r)
	}
	assertEffects(t, listed, perTenant)

	// The fifth tenant joins the source file, migrated first.
	fmt.Fprintf(&list, "%s %s\n", dbs[4].Name, dbs[4].ConnString)
	if err := os.WriteFile(file, []byte(list.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	m := &consumer.Message{ID: "z", Payload: []byte("z"), Headers: map[string]string{"tenant": dbs[4].Name}}
	if r := c.Process(ctx, m); r.Outcome != consumer.Applied {
		t.Errorf("the added tenant: %v", r)
	}
	assertEffects(t, dbs[4:], map[string][]string{dbs[4].Name: {"z"}})
}

// TestRoutedConsumerKilled delivers 300 messages of 6 tenants, 60 of them
// twice, from a queue table to two consumer processes (this test binary
// re-executed) that ack a message after Process settled it; one of them is
// SIGKILLed and started again every 700 ms, between commits and acks.
// Every effect is applied exactly once, in its tenant's database and in no
// other.
func TestRoutedConsumerKilled(t *testing.T) {
	if v := os.Getenv(tenantsChildEnv); v != "" {
		tenantsChild(t, v)
		return
	}
	t.Parallel()
	dbs, file := tenantDatabases(t, 6)
	ctx := context.Background()
	if err := routedConsumer(t, fleet.File(file), consumer.RoutedConfig{}).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	queueURL := testenv.PostgresURL(t)
	exec1(t, queueURL, `CREATE TABLE queue (n serial PRIMARY KEY, id text NOT NULL, tenant text NOT NULL, acked bool NOT NULL DEFAULT false)`)
	perTenant := map[string][]string{}
	for i := range 300 {
		tenant := dbs[i%len(dbs)].Name
		id := fmt.Sprintf("m-%03d", i)
		perTenant[tenant] = append(perTenant[tenant], id)
		exec1(t, queueURL, `INSERT INTO queue (id, tenant) VALUES ($1, $2)`, id, tenant)
		if i%5 == 0 { // a producer's re-send
			exec1(t, queueURL, `INSERT INTO queue (id, tenant) VALUES ($1, $2)`, id, tenant)
		}
	}
	start := func() *exec.Cmd {
		child := exec.Command(os.Args[0], "-test.run=^TestRoutedConsumerKilled$", "-test.count=1")
		child.Env = append(os.Environ(), tenantsChildEnv+"="+file+" "+queueURL)
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		return child
	}
	children := []*exec.Cmd{start(), start()}
	defer func() {
		for _, c := range children {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	queue, err := pgxpool.New(ctx, queueURL)
	if err != nil {
		t.Fatal(err)
	}
	defer queue.Close()
	kills, last := 0, time.Now()
	idemqtest.WaitFor(t, "every delivery acked", func() bool {
		if time.Since(last) > 700*time.Millisecond {
			_ = children[kills%2].Process.Kill() // SIGKILL
			_ = children[kills%2].Wait()
			children[kills%2] = start()
			kills, last = kills+1, time.Now()
		}
		var left int
		if err := queue.QueryRow(ctx, `SELECT count(*) FROM queue WHERE NOT acked`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	}, idemqtest.Within(3*time.Minute))
	assertEffects(t, dbs, perTenant)
	t.Logf("%d SIGKILLs; 360 deliveries of 300 messages over %d tenant databases, each applied once in its own", kills, len(dbs))
}

// tenantsChild is a consumer process of TestRoutedConsumerKilled: it takes
// the oldest unacked deliveries, applies each, and acks what settled.
func tenantsChild(t *testing.T, env string) {
	file, queueURL, _ := strings.Cut(env, " ")
	ctx := context.Background()
	queue, err := pgxpool.New(ctx, queueURL)
	if err != nil {
		t.Fatal(err)
	}
	c := routedConsumer(t, fleet.File(file), consumer.RoutedConfig{Config: consumer.Config{Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond}}})
	for {
		rows, err := queue.Query(ctx, `SELECT n, id, tenant FROM queue WHERE NOT acked ORDER BY random() LIMIT 10`)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		var id, tenant string
		var batch []func()
		if _, err := pgx.ForEachRow(rows, []any{&n, &id, &tenant}, func() error {
			n, m := n, &consumer.Message{ID: id, Payload: []byte(id), Headers: map[string]string{"tenant": tenant}}
			batch = append(batch, func() {
				if c.Process(ctx, m).Settled() {
					if _, err := queue.Exec(ctx, `UPDATE queue SET acked = true WHERE n = $1`, n); err != nil {
						t.Fatal(err)
					}
				}
			})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(batch) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		for _, process := range batch {
			process()
		}
	}
}
