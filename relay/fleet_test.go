package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/fleet"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// fleetDatabases creates n migrated databases on the test server whose
// connections carry app as their application_name, so pg_stat_activity
// tells them apart.
func fleetDatabases(t testing.TB, n int, app string) []fleet.Database {
	t.Helper()
	return fleetDatabasesOn(t, "", n, app, "tenant")
}

// fleetDatabasesOn is fleetDatabases on the server of adminURL ("" for the
// test server), the databases named prefix-NN.
func fleetDatabasesOn(t testing.TB, adminURL string, n int, app, prefix string) []fleet.Database {
	t.Helper()
	dbs := make([]fleet.Database, n)
	for i := range dbs {
		var connString string
		if adminURL == "" {
			connString = testenv.PostgresURL(t)
		} else {
			connString = createDatabase(t, adminURL, fmt.Sprintf("%s_%02d", prefix, i))
		}
		u, err := url.Parse(connString)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		dbs[i] = fleet.Database{Name: fmt.Sprintf("%s-%02d", prefix, i), ConnString: u.String()}
		ob := fleetOutbox(t, dbs[i])
		if err := ob.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return dbs
}

// createDatabase creates the database name on the server of adminURL and
// returns its connection string.
func createDatabase(t testing.TB, adminURL, name string) string {
	t.Helper()
	admin, err := pgxpool.New(context.Background(), adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// fleetOutbox opens the outbox of d on a pool of its own.
func fleetOutbox(t testing.TB, d fleet.Database) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(fleetOutboxPool(t, d), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// fleetOutboxPool opens a pool on d, closed at cleanup, whose connections
// are not counted as the fleet's.
func fleetOutboxPool(t testing.TB, d fleet.Database) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), strings.Replace(d.ConnString, "application_name=", "application_name=setup-", 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// enqueueTenant writes n messages of keys keys into d, the payload naming the
// database, the key and the message's place in its key's order.
func enqueueTenant(t testing.TB, d fleet.Database, n, keys int) {
	t.Helper()
	enqueueKeys(t, d, n, keys, "k")
}

// enqueueKeys is enqueueTenant with keys named prefix and a number.
func enqueueKeys(t testing.TB, d fleet.Database, n, keys int, prefix string) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		key := fmt.Sprintf("%s%d", prefix, i%keys)
		msgs[i] = outbox.Message{Destination: "events", Key: key, Payload: fmt.Appendf(nil, "%s/%s/%d", d.Name, key, i/keys)}
	}
	if err := fleetOutbox(t, d).Enqueue(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

// fleetSink records every publish and checks each key's order per
// database.
type fleetSink struct {
	mu    sync.Mutex
	got   map[string]int // database/key -> next place expected
	count map[string]int // database -> messages
	wrong []string
}

func newFleetSink() *fleetSink { return &fleetSink{got: map[string]int{}, count: map[string]int{}} }

func (s *fleetSink) Publish(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range batch {
		db, rest, _ := strings.Cut(string(m.Payload), "/")
		key, place, _ := strings.Cut(rest, "/")
		var n int
		fmt.Sscan(place, &n)
		if want := s.got[db+"/"+key]; n != want {
			s.wrong = append(s.wrong, fmt.Sprintf("%s: place %d, want %d", m.Payload, n, want))
		}
		s.got[db+"/"+key] = n + 1
		s.count[db]++
	}
	return nil
}

func (s *fleetSink) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.count {
		n += c
	}
	return n
}

// connections counts the server connections of application app.
func connections(t *testing.T, admin *pgxpool.Pool, app string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFleetDrainsManyDatabasesWithinTheBudget drains 12 databases on two
// servers (the test server and a private one) through a budget that fits
// two databases of each server at a time: every message of every database
// is published once, in its key's order, and the process never holds more
// connections on either server than the budget, sampled from each
// server's pg_stat_activity throughout.
func TestFleetDrainsManyDatabasesWithinTheBudget(t *testing.T) {
	t.Parallel()
	const budget, perDB, keys = 9, 300, 7 // 1 watcher + 2 x (1 worker + 3)
	app := "fleet-budget-" + fmt.Sprint(time.Now().UnixNano())
	second := testenv.PrivatePostgres(t)
	dbs := append(fleetDatabases(t, 6, app), fleetDatabasesOn(t, second.URL(), 6, app, "second")...)
	for _, d := range dbs {
		enqueueTenant(t, d, perDB, keys)
	}
	sink := newFleetSink()
	_, running := startFleet(t, fleet.Static(dbs...), sink, relay.FleetConfig{ConnsPerServer: budget, Quantum: 300 * time.Millisecond,
		Relay: relay.Config{BatchSize: 50, Logger: quiet}, Logger: quiet})

	admin := testenv.Postgres(t)
	admin2, err := pgxpool.New(context.Background(), second.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin2.Close()
	most := 0
	want := len(dbs) * perDB
	idemqtest.WaitFor(t, "every message of every database published", func() bool {
		most = max(most, connections(t, admin, app), connections(t, admin2, app))
		return sink.total() >= want
	}, idemqtest.Within(2*time.Minute))
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}
	if most > budget {
		t.Errorf("the fleet held %d connections on a server; budget %d", most, budget)
	}
	if len(sink.wrong) > 0 {
		t.Errorf("out of order: %v", sink.wrong)
	}
	for _, d := range dbs {
		if got := sink.count[d.Name]; got != perDB {
			t.Errorf("%s: %d messages published, want %d", d.Name, got, perDB)
		}
	}
	t.Logf("12 databases on 2 servers x %d messages drained; at most %d connections on a server (budget %d)", perDB, most, budget)
}

// TestFleetFollowsItsSource adds a database to the source file while the
// fleet runs, and lists one that does not exist: the new one is drained
// without a restart, the missing one is reported and holds nothing back.
func TestFleetFollowsItsSource(t *testing.T) {
	t.Parallel()
	app := "fleet-source-" + fmt.Sprint(time.Now().UnixNano())
	dbs := fleetDatabases(t, 3, app)
	missing := fleet.Database{Name: "gone", ConnString: strings.Replace(dbs[0].ConnString, "/idemq_test_", "/idemq_never_", 1)}
	file := filepath.Join(t.TempDir(), "databases")
	write := func(dbs ...fleet.Database) {
		var b strings.Builder
		b.WriteString("# tenants\n")
		for _, d := range dbs {
			fmt.Fprintf(&b, "%s %s\n", d.Name, d.ConnString)
		}
		if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(dbs[0], dbs[1], missing)
	for _, d := range dbs {
		enqueueTenant(t, d, 50, 5)
	}
	sink := newFleetSink()
	f, _ := startFleet(t, fleet.File(file), sink, relay.FleetConfig{Reload: 100 * time.Millisecond,
		Relay: relay.Config{Logger: quiet}, Logger: quiet})
	idemqtest.WaitFor(t, "the listed databases drained despite the missing one", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.count[dbs[0].Name] == 50 && sink.count[dbs[1].Name] == 50
	}, idemqtest.Within(time.Minute))
	idemqtest.WaitFor(t, "the missing database reported as dropped", func() bool {
		for _, d := range f.Databases() {
			if d.Name == "gone" && d.Err != nil && strings.Contains(d.Err.Error(), "dropped") {
				return true
			}
		}
		return false
	}, idemqtest.Within(time.Minute))

	write(dbs[0], dbs[1], dbs[2]) // a tenant added, the missing one removed
	idemqtest.WaitFor(t, "the added database drained", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.count[dbs[2].Name] == 50
	}, idemqtest.Within(time.Minute))
	idemqtest.WaitFor(t, "the removed database released", func() bool {
		for _, d := range f.Databases() {
			if d.Name == "gone" {
				return false
			}
		}
		return true
	}, idemqtest.Within(time.Minute))
	if len(sink.wrong) > 0 {
		t.Errorf("out of order: %v", sink.wrong)
	}
}

// TestFleetWakesAnIdleDatabase publishes a row written into a database
// after the fleet went idle: found through the server's statistics.
func TestFleetWakesAnIdleDatabase(t *testing.T) {
	t.Parallel()
	app := "fleet-idle-" + fmt.Sprint(time.Now().UnixNano())
	dbs := fleetDatabases(t, 4, app)
	sink := newFleetSink()
	f, _ := startFleet(t, fleet.Static(dbs...), sink, relay.FleetConfig{IdleRelease: 200 * time.Millisecond, Sweep: time.Hour,
		Relay: relay.Config{Logger: quiet}, Logger: quiet})
	idemqtest.WaitFor(t, "every relay released while the databases are empty", func() bool {
		for _, d := range f.Databases() {
			if d.Draining {
				return false
			}
		}
		return true
	}, idemqtest.Within(time.Minute))
	enqueueTenant(t, dbs[3], 3, 1)
	idemqtest.WaitFor(t, "the row of the idle database published", func() bool { return sink.total() == 3 }, idemqtest.Within(time.Minute))
}

// fleetChildEnv carries the source file, the record database and the
// child's application name to the fleet processes of
// TestFleetProcessesSIGKILLed.
const fleetChildEnv = "RELAY_TEST_FLEET_CHILD"

// TestFleetProcessesSIGKILLed drains 10 databases with three fleet
// processes (this test binary re-executed; LeaseTTL 1 s) while one of them
// is SIGKILLed and started again every second or so. Their Sink records
// every publish in a table of another database. Every message of every
// database is published, the messages of each key first appear in their
// enqueue order, and no process ever holds more connections on the server
// than its budget (sampled from pg_stat_activity by application_name).
func TestFleetProcessesSIGKILLed(t *testing.T) {
	if v := os.Getenv(fleetChildEnv); v != "" {
		fleetChild(t, v)
		return
	}
	t.Parallel()
	const budget, perDB, keys = 9, 400, 8
	stamp := fmt.Sprint(time.Now().UnixNano())
	dbs := fleetDatabases(t, 10, "fleet-kill-setup-"+stamp)
	for _, d := range dbs {
		enqueueTenant(t, d, perDB, keys)
	}
	recordURL := testenv.PostgresURL(t)
	record, err := pgxpool.New(context.Background(), recordURL)
	if err != nil {
		t.Fatal(err)
	}
	defer record.Close()
	if _, err := record.Exec(context.Background(), `CREATE TABLE published (n bigserial PRIMARY KEY, payload text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "databases")
	var list strings.Builder
	for _, d := range dbs {
		// Each child puts its number in place of "child".
		fmt.Fprintf(&list, "%s %s\n", d.Name, strings.Replace(d.ConnString, "fleet-kill-setup-"+stamp, "fleet-kill-"+stamp+"-child", 1))
	}
	if err := os.WriteFile(file, []byte(list.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(i int) *exec.Cmd {
		child := exec.Command(os.Args[0], "-test.run=^TestFleetProcessesSIGKILLed$", "-test.count=1")
		child.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", fleetChildEnv, file, recordURL, i))
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		return child
	}
	children := []*exec.Cmd{start(0), start(1), start(2)}
	defer func() {
		for _, c := range children {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	admin := testenv.Postgres(t)
	published := func() int {
		var n int
		if err := record.QueryRow(context.Background(), `SELECT count(DISTINCT payload) FROM published`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	kills, most := 0, 0
	last := time.Now()
	idemqtest.WaitFor(t, "every message of every database published", func() bool {
		rows, err := admin.Query(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fleet-kill-' || $1 || '-%' GROUP BY application_name`, stamp)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n int
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			most = max(most, n)
		}
		rows.Close()
		if time.Since(last) > time.Second && kills < 12 {
			i := kills % len(children)
			_ = children[i].Process.Kill() // SIGKILL
			_ = children[i].Wait()
			children[i] = start(i)
			kills++
			last = time.Now()
		}
		return published() >= len(dbs)*perDB
	}, idemqtest.Within(4*time.Minute))

	// Each key's messages first appear in their enqueue order.
	rows, err := record.Query(context.Background(), `SELECT payload FROM published ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]bool{}
	next := map[string]int{}
	total := 0
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		total++
		if first[p] {
			continue // a re-publish after a kill
		}
		first[p] = true
		i := strings.LastIndex(p, "/")
		var place int
		fmt.Sscan(p[i+1:], &place)
		if place != next[p[:i]] {
			t.Errorf("%s first published before place %d of its key", p, next[p[:i]])
		}
		next[p[:i]] = place + 1
	}
	if most > budget {
		t.Errorf("a fleet process held %d connections on the server; budget %d", most, budget)
	}
	t.Logf("%d kills; %d messages, %d publishes (%d again after kills); at most %d connections per process (budget %d)",
		kills, len(first), total, total-len(first), most, budget)
}

// fleetChild runs a fleet process of TestFleetProcessesSIGKILLed until it
// is killed.
func fleetChild(t *testing.T, env string) {
	var file, recordURL, name string
	if _, err := fmt.Sscan(env, &file, &recordURL, &name); err != nil {
		t.Fatal(err)
	}
	record, err := pgxpool.New(context.Background(), recordURL)
	if err != nil {
		t.Fatal(err)
	}
	defer record.Close()
	// Each process marks its connections with its own application_name.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(t.TempDir(), "databases")
	if err := os.WriteFile(own, []byte(strings.ReplaceAll(string(data), "-child", "-"+name)), 0o600); err != nil {
		t.Fatal(err)
	}
	sink := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		for _, m := range batch {
			if _, err := record.Exec(ctx, `INSERT INTO published (payload) VALUES ($1)`, string(m.Payload)); err != nil {
				return err
			}
		}
		time.Sleep(5 * time.Millisecond) // a broker round trip
		return nil
	})
	f, err := relay.NewFleet(fleet.File(own), sink, relay.FleetConfig{ConnsPerServer: 9, Quantum: 300 * time.Millisecond,
		Relay: relay.Config{BatchSize: 20, LeaseTTL: time.Second, Logger: quiet}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Run(context.Background()) // until SIGKILL
}

// TestFleetManyIdleDatabases runs one fleet process over
// IDEMQ_FLEET_IDLE_DATABASES empty databases (12 in make test, 1,000 in
// make soak): once it has looked at each, it holds only its watcher's
// connection and its memory is logged; a row then enqueued in one of them
// is published, and how long that took is logged against the documented
// bound (the watch interval plus the statistics' delay).
func TestFleetManyIdleDatabases(t *testing.T) {
	t.Parallel()
	n := 12
	if v, err := strconv.Atoi(os.Getenv("IDEMQ_FLEET_IDLE_DATABASES")); err == nil && v > 0 {
		n = v
	}
	app := "fleet-idle-many-" + fmt.Sprint(time.Now().UnixNano())
	dbs := fleetDatabases(t, n, app)
	sink := newFleetSink()
	f, _ := startFleet(t, fleet.Static(dbs...), sink, relay.FleetConfig{IdleRelease: 100 * time.Millisecond,
		Relay: relay.Config{Logger: quiet}, Logger: quiet})
	admin := testenv.Postgres(t)
	idemqtest.WaitFor(t, "every database looked at and released", func() bool {
		for _, d := range f.Databases() {
			if d.Draining || d.Err != nil {
				return false
			}
		}
		return connections(t, admin, app) <= 1
	}, idemqtest.Within(10*time.Minute))
	var mem runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&mem)
	t.Logf("%d idle databases: %d connection(s) held on the server, heap in use %.1f MiB", n, connections(t, admin, app), float64(mem.HeapInuse)/(1<<20))

	target := dbs[n/2]
	start := time.Now()
	enqueueTenant(t, target, 1, 1)
	idemqtest.WaitFor(t, "the row of one idle database published", func() bool { return sink.total() == 1 }, idemqtest.Within(2*time.Minute))
	t.Logf("a row enqueued in 1 of %d idle databases published after %v (bound: WatchInterval %v + up to 10 s of statistics delay; Sweep %v at most)",
		n, time.Since(start).Round(time.Millisecond), relay.WatchIntervalDefault, relay.SweepDefault)
}

// TestFleetIsolatesADroppedDatabase drops one of four databases while the
// fleet drains them: the others are drained, the dropped one is reported
// as dropped and holds no connection, and nothing waits on it.
func TestFleetIsolatesADroppedDatabase(t *testing.T) {
	t.Parallel()
	app := "fleet-drop-" + fmt.Sprint(time.Now().UnixNano())
	dbs := fleetDatabases(t, 4, app)
	for _, d := range dbs {
		enqueueTenant(t, d, 100, 4)
	}
	sink := newFleetSink()
	f, _ := startFleet(t, fleet.Static(dbs...), sink, relay.FleetConfig{ConnsPerServer: 9, Quantum: 200 * time.Millisecond,
		Relay: relay.Config{Logger: quiet}, Logger: quiet})
	admin := testenv.Postgres(t)
	u, err := url.Parse(dbs[0].ConnString)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(context.Background(), `DROP DATABASE `+strings.TrimPrefix(u.Path, "/")+` WITH (FORCE)`); err != nil {
		t.Fatal(err)
	}
	for _, d := range dbs[1:] {
		enqueueKeys(t, d, 100, 4, "after") // more work after the drop
	}
	idemqtest.WaitFor(t, "the other databases drained", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		for _, d := range dbs[1:] {
			if sink.count[d.Name] < 200 {
				return false
			}
		}
		return true
	}, idemqtest.Within(2*time.Minute))
	idemqtest.WaitFor(t, "the dropped database reported and released", func() bool {
		for _, d := range f.Databases() {
			if d.Name == dbs[0].Name {
				return !d.Draining && d.Err != nil && strings.Contains(d.Err.Error(), "dropped")
			}
		}
		return false
	}, idemqtest.Within(time.Minute))
	if len(sink.wrong) > 0 {
		t.Errorf("out of order: %v", sink.wrong)
	}
}

// watermarkSink is a Sink that says it is a Watermarker.
type watermarkSink struct{ relay.SinkFunc }

func (watermarkSink) Watermark(context.Context, int, int64) (relay.Watermark, error) {
	return relay.Watermark{}, nil
}

// TestFleetRefusesTransactionalSinks: a Watermarker, directly or behind a
// Router, is refused, since its ids are per outbox partition.
func TestFleetRefusesTransactionalSinks(t *testing.T) {
	t.Parallel()
	src := fleet.Static()
	tx := watermarkSink{func(context.Context, relay.BatchID, []relay.Message) error { return nil }}
	if _, err := relay.NewFleet(src, tx, relay.FleetConfig{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("a Watermarker: %v", err)
	}
	router := relay.NewRouter()
	f, err := relay.NewFleet(src, router, relay.FleetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := router.Route("orders", tx); err != nil {
		t.Fatal(err)
	}
	if err := f.Run(context.Background()); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("a Router with a Watermarker route: %v", err)
	}
}

// startFleet starts a fleet of src into sink, stopped at cleanup.
func startFleet(t *testing.T, src fleet.Source, sink relay.Sink, cfg relay.FleetConfig) (*relay.Fleet, *idemq.Running) {
	t.Helper()
	f, err := relay.NewFleet(src, sink, cfg)
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Stop() })
	return f, running
}
