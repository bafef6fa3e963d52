//go:build !race

package idemwatermill_test

import (
	"os/exec"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
)

// TestPubSubReconnect runs the suite's reconnect test, which Watermill
// runs only with a command that restarts the broker: here the command
// (psql) terminates every session of the test's database twice while 100
// publishers write 10,000 messages and a subscriber reads them, so the
// publishers, the relay and its LISTEN connection all lose the database
// and carry on; every message is received.
//
// Watermill's TestReconnect races with itself (its publishers append to a
// slice the test reads unsynchronized), so this file is left out under the
// race detector: make test runs it in a go test of its own, without -race.
func TestPubSubReconnect(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatal("psql not found: install the Postgres client (apt-get install -y postgresql-client)")
	}
	s := newSuite(t)
	f := features(false)
	f.RestartServiceCommand = []string{psql, "-X", "-q", "-d", s.pool.Config().ConnString(), "-c",
		`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`}
	tests.TestReconnect(t, tests.TestContext{TestID: tests.NewTestID(), Features: f}, s.pubSub)
}
