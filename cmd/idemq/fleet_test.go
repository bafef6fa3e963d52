package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// fleetFile writes a --databases-from file of the databases, by name.
func fleetFile(t *testing.T, dbs map[string]string) string {
	t.Helper()
	var b strings.Builder
	for name, url := range dbs {
		fmt.Fprintf(&b, "%s %s\n", name, url)
	}
	path := filepath.Join(t.TempDir(), "databases")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMigrateFleet migrates three databases and one that does not exist
// with one command: it reports each, goes on past the missing one and
// exits 1 naming it; migrate validate is then the deploy gate: exit 0 on
// the three, 4 once an unmigrated database joins the file.
func TestMigrateFleet(t *testing.T) {
	t.Parallel()
	dbs := map[string]string{}
	for _, name := range []string{"acme", "globex", "initech"} {
		dbs[name] = testenv.PostgresURL(t)
	}
	dbs["gone"] = strings.Replace(dbs["acme"], "/idemq_test_", "/idemq_gone_", 1)
	file := fleetFile(t, dbs)
	r := wantCode(t, "", exitFailure, "--json", "migrate", "--databases-from", file, "--concurrency", "2")
	var results []struct{ Database, Result, Error string }
	if err := json.Unmarshal([]byte(r.stdout), &results); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(results) != 4 {
		t.Fatalf("%d results, want one per database: %s", len(results), r.stdout)
	}
	for _, res := range results {
		want := "applied"
		if res.Database == "gone" {
			want = "failed"
		}
		if !strings.Contains(res.Result, want) {
			t.Errorf("%s: %q, want %s (%s)", res.Database, res.Result, want, res.Error)
		}
	}
	if !strings.Contains(r.stderr, "1 of 4 databases failed: gone") {
		t.Errorf("stderr does not name the failed database: %s", r.stderr)
	}

	delete(dbs, "gone")
	file = fleetFile(t, dbs)
	wantCode(t, "", 0, "migrate", "validate", "--databases-from", file)
	dbs["hooli"] = testenv.PostgresURL(t)
	r = wantCode(t, "", exitPending, "migrate", "validate", "--databases-from", fleetFile(t, dbs))
	if !strings.Contains(r.stderr, "hooli") {
		t.Errorf("validate does not name the database with pending migrations: %s", r.stderr)
	}
	wantCode(t, "", exitUsage, "migrate", "--databases-from", file, "--concurrency", "0")
	wantCode(t, "", exitUsage, "migrate", "--databases-from", " "+file)
}

// TestRelayFleet runs idemq relay --databases-from over three databases
// into Kafka: every message of every database is published; a database
// added to the file while it runs is drained without a restart.
func TestRelayFleet(t *testing.T) {
	t.Parallel()
	kc := testenv.Kafka(t, 1, "ledger")
	topic := kc.Topic("ledger")
	dbs := map[string]string{}
	obs := map[string]*outbox.Outbox{}
	for _, name := range []string{"acme", "globex", "initech", "hooli"} {
		url := testenv.PostgresURL(t)
		mustRun(t, url, "migrate")
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if obs[name], err = outbox.New(pool, outbox.Config{}); err != nil {
			t.Fatal(err)
		}
		dbs[name] = url
		enqueue(t, obs[name], topic, 200, 10)
	}
	last := dbs["hooli"]
	delete(dbs, "hooli")
	file := fleetFile(t, dbs)
	relay := startEnv(t, env(), "relay", "--databases-from", file, "--route", topic+"=kafka", "--kafka-brokers", strings.Join(kc.Brokers, ","))
	drained := func(names ...string) func() error {
		return func() error {
			for _, n := range names {
				if p := pending(t, obs[n]); p > 0 {
					return fmt.Errorf("%s: %d pending", n, p)
				}
			}
			return nil
		}
	}
	idemqtest.WaitForNoError(t, "the three databases drained", drained("acme", "globex", "initech"), idemqtest.Within(2*time.Minute))
	dbs["hooli"] = last
	if err := os.WriteFile(file, []byte(strings.Join(func() []string {
		var lines []string
		for n, u := range dbs {
			lines = append(lines, n+" "+u)
		}
		return lines
	}(), "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitForNoError(t, "the added database drained", drained("hooli"), idemqtest.Within(2*time.Minute))
	out := mustRun(t, "", "stats", "--databases-from", file)
	for _, name := range []string{"acme", "globex", "initech", "hooli"} {
		if !strings.Contains(out, name) || !strings.Contains(out, "backlog 0") {
			t.Errorf("stats --databases-from: no drained line for %s:\n%s", name, out)
		}
	}
	if code := relay.signal(t, syscall.SIGTERM, time.Minute); code != 0 {
		t.Fatalf("relay exit %d\n%s", code, relay.stderr.String())
	}
	msgs, err := kc.ReadAll(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) < 800 {
		t.Errorf("%d messages on the topic, want 800", len(msgs))
	}
	wantCode(t, "", exitUsage, "relay", "--databases-from", file, "--route", topic+"=kafka-tx", "--kafka-brokers", strings.Join(kc.Brokers, ","),
		"--kafka-tx-id-prefix", "p-", "--kafka-watermark-topic", "w")
}
