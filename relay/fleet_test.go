package relay_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
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

// fleetDatabases creates n migrated databases whose connections carry
// app as their application_name, so pg_stat_activity tells them apart.
func fleetDatabases(t *testing.T, n int, app string) []fleet.Database {
	t.Helper()
	dbs := make([]fleet.Database, n)
	for i := range dbs {
		u, err := url.Parse(testenv.PostgresURL(t))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", app)
		u.RawQuery = q.Encode()
		dbs[i] = fleet.Database{Name: fmt.Sprintf("tenant-%02d", i), ConnString: u.String()}
		ob := fleetOutbox(t, dbs[i])
		if err := ob.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return dbs
}

// fleetOutbox opens the outbox of d on a pool closed at cleanup.
func fleetOutbox(t *testing.T, d fleet.Database) *outbox.Outbox {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), strings.Replace(d.ConnString, "application_name=", "application_name=setup-", 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

// enqueueTenant writes n messages of keys keys into d, the payload naming the
// database, the key and the message's place in its key's order.
func enqueueTenant(t *testing.T, d fleet.Database, n, keys int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		key := fmt.Sprintf("k%d", i%keys)
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

func (s *fleetSink) Publish(_ context.Context, batch []relay.Message) error {
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

// TestFleetDrainsManyDatabasesWithinTheBudget drains 12 databases through
// a budget that fits two of them at a time: every message of every
// database is published once, in its key's order, and the process never
// holds more connections on the server than the budget, sampled from
// pg_stat_activity throughout.
func TestFleetDrainsManyDatabasesWithinTheBudget(t *testing.T) {
	t.Parallel()
	const budget, perDB, keys = 9, 300, 7 // 1 watcher + 2 x (1 worker + 3)
	app := "fleet-budget-" + fmt.Sprint(time.Now().UnixNano())
	dbs := fleetDatabases(t, 12, app)
	for _, d := range dbs {
		enqueueTenant(t, d, perDB, keys)
	}
	sink := newFleetSink()
	f, err := relay.NewFleet(fleet.Static(dbs...), sink, relay.FleetConfig{ConnsPerServer: budget, Quantum: 300 * time.Millisecond,
		Relay: relay.Config{BatchSize: 50, Logger: quiet}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Stop()

	admin := testenv.Postgres(t)
	most := 0
	want := len(dbs) * perDB
	idemqtest.WaitFor(t, "every message of every database published", func() bool {
		most = max(most, connections(t, admin, app))
		return sink.total() >= want
	}, idemqtest.Within(2*time.Minute))
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}
	if most > budget {
		t.Errorf("the fleet held %d connections on the server; budget %d", most, budget)
	}
	if len(sink.wrong) > 0 {
		t.Errorf("out of order: %v", sink.wrong)
	}
	for _, d := range dbs {
		if got := sink.count[d.Name]; got != perDB {
			t.Errorf("%s: %d messages published, want %d", d.Name, got, perDB)
		}
	}
	t.Logf("12 databases x %d messages drained; at most %d connections (budget %d)", perDB, most, budget)
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
	f, err := relay.NewFleet(fleet.File(file), sink, relay.FleetConfig{Reload: 100 * time.Millisecond,
		Relay: relay.Config{Logger: quiet}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Stop()
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
	f, err := relay.NewFleet(fleet.Static(dbs...), sink, relay.FleetConfig{IdleRelease: 200 * time.Millisecond, Sweep: time.Hour,
		Relay: relay.Config{Logger: quiet}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Stop()
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
