package main

// The bad-input suite of the binary: each test gives idemq what a careless
// user or a tired operator would, and checks that it answers with the
// documented exit code and an error that says what to do, and that nothing
// was deleted or changed that was not asked for. Add a case here for each
// new flag or command.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/testenv"
)

// deadLetters enqueues one message per destination and turns them all into
// dead letters; it returns their ids.
func deadLetters(t *testing.T, dests ...string) (url string, ob *outbox.Outbox, ids []string) {
	t.Helper()
	url, pool, ob := database(t)
	for _, dest := range dests {
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: dest, Payload: []byte(`{}`)}
		if err := ob.Enqueue(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID.String())
	}
	deadLetter(t, pool, ob, len(dests))
	return url, ob, ids
}

// inboxDeadLetterSet makes an inbox dead letter of each key in scope, each
// after 3 failures with the error "card declined", and returns the inbox.
func inboxDeadLetterSet(t *testing.T, pool *pgxpool.Pool, scope string, keys ...string) *inbox.Store {
	t.Helper()
	ctx := context.Background()
	// A handler that always fails, under one attempt: each key becomes a
	// dead letter with its error.
	c, err := consumer.New(pool, scope, func(context.Context, pgx.Tx, *consumer.Message) error {
		return errors.New("card declined")
	}, consumer.Config{Retry: idemq.Retry{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if r := c.Process(ctx, &consumer.Message{ID: key, Payload: []byte("fp")}); r.Outcome != consumer.DeadLettered {
			t.Fatalf("%s: %+v, want DeadLettered", key, r)
		}
	}
	return c.Store()
}

// deadCount is the number of outbox dead letters.
func deadCount(t *testing.T, ob *outbox.Outbox) int64 {
	t.Helper()
	return outboxStats(t, ob).Dead
}

// TestBadInputDLQNegativeAgeIsAUsageError: a negative (or zero) --older-than or
// --newer-than used to be dropped, so that purge deleted every dead
// letter. It is a usage error, for the outbox and the inbox, in every dlq
// command, and nothing is touched.
func TestBadInputDLQNegativeAgeIsAUsageError(t *testing.T) {
	t.Parallel()
	url, ob, _ := deadLetters(t, "payments", "emails")
	for _, args := range [][]string{
		{"dlq", "purge", "--older-than", "-1h"},
		{"dlq", "purge", "--newer-than", "-1h"},
		{"dlq", "purge", "--older-than", "0s"},
		{"dlq", "purge", "--inbox", "--older-than", "-1h"},
		{"dlq", "purge", "--inbox", "--conflicts", "--newer-than", "-1m"},
		{"dlq", "replay", "--older-than", "-1h"},
		{"dlq", "replay", "--inbox", "--newer-than", "-1h"},
		{"dlq", "list", "--older-than", "-1h"},
	} {
		r := wantCode(t, url, exitUsage, args...)
		if !strings.Contains(r.stderr, "positive age") {
			t.Errorf("idemq %v: stderr %q does not say an age must be positive", args, r.stderr)
		}
	}
	if n := deadCount(t, ob); n != 2 {
		t.Fatalf("%d dead letters left, want the 2 nothing was asked to touch", n)
	}
}

// TestBadInputDLQPurgeNeedsAFilterOrAll: purge with no filter is refused; --all
// with a filter is refused; --dry-run lists and counts what would go and
// changes nothing; --all purges everything.
func TestBadInputDLQPurgeNeedsAFilterOrAll(t *testing.T) {
	t.Parallel()
	url, ob, ids := deadLetters(t, "payments", "payments", "emails")
	for _, args := range [][]string{
		{"dlq", "purge"},
		{"dlq", "purge", "--inbox"},
		{"dlq", "purge", "--inbox", "--conflicts"},
		{"dlq", "purge", "--limit", "1"},
		{"dlq", "purge", "--destination", "payments", "--limit", "0"}, // 0 would be no limit
		{"dlq", "replay", "--inbox", "--limit", "-1"},
		{"dlq", "purge", "--all", "--destination", "emails"},
		{"dlq", "replay", "--all", "--destination", "emails"},
	} {
		wantCode(t, url, exitUsage, args...)
	}
	if n := deadCount(t, ob); n != 3 {
		t.Fatalf("%d dead letters after refused purges, want 3", n)
	}

	out := mustRun(t, url, "dlq", "purge", "--all", "--dry-run")
	for _, id := range ids {
		if !strings.Contains(out, id) {
			t.Errorf("purge --dry-run does not list %s:\n%s", id, out)
		}
	}
	if !strings.Contains(out, "would have purged 3 outbox dead letters (all of them); nothing changed") {
		t.Errorf("purge --dry-run does not give the count:\n%s", out)
	}
	var dry struct {
		N    int64            `json:"would_have_purged"`
		Dead []deadLetterJSON `json:"dead_letters"`
	}
	mustJSON(t, url, &dry, "dlq", "purge", "--destination", "payments", "--dry-run")
	if dry.N != 2 || len(dry.Dead) != 2 {
		t.Errorf("purge --destination payments --dry-run --json: %+v, want 2 listed and counted", dry)
	}
	var replayDry map[string]any
	mustJSON(t, url, &replayDry, "dlq", "replay", "--dry-run")
	if replayDry["would_have_replayed"] != float64(3) {
		t.Errorf("replay --dry-run: %v, want 3", replayDry)
	}
	if n := deadCount(t, ob); n != 3 {
		t.Fatalf("%d dead letters after dry runs, want 3", n)
	}

	// Standard input is not a terminal here: no question is asked.
	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "purge", "--all")
	if moved["purged"] != 3 || deadCount(t, ob) != 0 {
		t.Fatalf("purge --all: %v, %d left; want 3 purged", moved, deadCount(t, ob))
	}
}

// TestBadInputDLQReplayOfAMissingIDChangesNothing: replay --id A --id B where B is
// no dead letter names B, exits 5 and replays nothing, A included.
func TestBadInputDLQReplayOfAMissingIDChangesNothing(t *testing.T) {
	t.Parallel()
	url, ob, ids := deadLetters(t, "payments", "emails")
	missing := uuid.Must(uuid.NewV7()).String()
	for _, verb := range []string{"replay", "purge"} {
		r := wantCode(t, url, exitNotFound, "dlq", verb, "--id", ids[0], "--id", missing)
		if !strings.Contains(r.stderr, missing) || strings.Contains(r.stderr, ids[0]) {
			t.Errorf("dlq %s: stderr %q, want it to name %s alone", verb, r.stderr, missing)
		}
		// An id that exists but that another filter excludes is missing too.
		wantCode(t, url, exitNotFound, "dlq", verb, "--id", ids[0], "--destination", "emails")
	}
	if n := deadCount(t, ob); n != 2 {
		t.Fatalf("%d dead letters after refused replays, want 2", n)
	}
	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "replay", "--id", ids[0], "--id", ids[1])
	if moved["replayed"] != 2 {
		t.Fatalf("replay of two existing ids: %v", moved)
	}
}

// TestBadInputDLQReplayOfAMissingInboxKeyChangesNothing: with --inbox, --id
// names inbox keys (the message ids); replay or purge --inbox --id A --id
// B where B is no dead letter names B, exits 5 and changes nothing, A
// included. A --key that matches nothing exits 5 too.
func TestBadInputDLQReplayOfAMissingInboxKeyChangesNothing(t *testing.T) {
	t.Parallel()
	url, pool, _ := database(t)
	ctx := context.Background()
	ib := inboxDeadLetterSet(t, pool, "billing", "order-1", "order-2")
	stillDead := func(when string) {
		t.Helper()
		for _, key := range []string{"order-1", "order-2"} {
			if rec, err := ib.Get(ctx, "billing", key); err != nil || rec.Status != inbox.FailedFinal {
				t.Fatalf("%s: %s is %+v, %v; want it still a dead letter", when, key, rec, err)
			}
		}
	}
	for _, verb := range []string{"replay", "purge"} {
		r := wantCode(t, url, exitNotFound, "dlq", verb, "--inbox", "--id", "order-1", "--id", "order-9")
		if !strings.Contains(r.stderr, `"order-9"`) || strings.Contains(r.stderr, "order-1") {
			t.Errorf("dlq %s --inbox: stderr %q, want it to name order-9 alone", verb, r.stderr)
		}
		// A key that exists but that another filter excludes is missing too.
		wantCode(t, url, exitNotFound, "dlq", verb, "--inbox", "--id", "order-1", "--scope", "shipping")
		wantCode(t, url, exitNotFound, "dlq", verb, "--inbox", "--id", "order-1", "--conflicts")
		r = wantCode(t, url, exitNotFound, "dlq", verb, "--inbox", "--key", "order-9")
		if !strings.Contains(r.stderr, "order-9") {
			t.Errorf("dlq %s --inbox --key order-9: stderr %q, want it to name the key", verb, r.stderr)
		}
		wantCode(t, url, exitUsage, "dlq", verb, "--inbox", "--id", "order-1", "--key", "order-2")
		stillDead("after refused " + verb)
	}
	var dry map[string]any
	mustJSON(t, url, &dry, "dlq", "purge", "--inbox", "--id", "order-1", "--id", "order-2", "--dry-run")
	if dry["would_have_purged"] != float64(2) {
		t.Fatalf("purge --inbox --id --id --dry-run: %v, want 2", dry)
	}
	stillDead("after a dry run")
	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "replay", "--inbox", "--id", "order-1", "--id", "order-2")
	if moved["replayed"] != 2 {
		t.Fatalf("replay --inbox of two existing keys: %v", moved)
	}
	for _, key := range []string{"order-1", "order-2"} {
		if rec, err := ib.Get(ctx, "billing", key); err != nil || rec.Status != inbox.FailedRetryable {
			t.Errorf("%s after replay: %+v, %v; want FAILED_RETRYABLE", key, rec, err)
		}
	}
}

// TestBadInputRelayChecksItsFlagsBeforeTouchingTheDatabase: a bad route, lease or
// --config is a usage error (2) found before --migrate migrates anything,
// and also when the database does not answer.
func TestBadInputRelayChecksItsFlagsBeforeTouchingTheDatabase(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	nats := []string{"--nats-url", "nats://127.0.0.1:1"}
	badConfig := filepath.Join(t.TempDir(), "two-objects.json")
	if err := os.WriteFile(badConfig, []byte(`{"routes": ["orders.*=nats"]} {"routes": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		args       []string
	}{
		{"unknown sink", "unknown sink", []string{"--route", "orders.*=rabbitmq"}},
		{"blank before the sink", "remove the blanks", append([]string{"--route", "orders.* =nats"}, nats...)},
		{"blank after the pattern", "remove the blanks", append([]string{"--route", "orders.*= nats"}, nats...)},
		{"empty target", "empty TARGET", append([]string{"--route", "orders.*=nats:"}, nats...)},
		{"duplicate route", "orders", append([]string{"--route", "orders=nats", "--route", "orders=jetstream"}, nats...)},
		{"route without broker", "--kafka-brokers", []string{"--route", "orders=kafka"}},
		{"kafka-tx route without broker", "--kafka-brokers", []string{"--route", "orders=kafka-tx"}},
		{"franz route without broker", "--kafka-brokers", []string{"--route", "orders.*=franz:ORDERS"}},
		{"bad network", "--webhook-allow-network", []string{"--webhooks", "--webhook-allow-network", "10.0.0.0/33"}},
		{"lease of 1ns", "--lease-ttl: 1ns is below the minimum of 100ms", append([]string{"--route", "orders=nats", "--lease-ttl", "1ns"}, nats...)},
		{"lease of 2ns", "--lease-ttl", append([]string{"--route", "orders=nats", "--lease-ttl", "2ns"}, nats...)},
		{"negative poll interval", "--poll-interval", append([]string{"--route", "orders=nats", "--poll-interval", "-1s"}, nats...)},
		{"no shutdown grace (would be the default 10s)", "--shutdown-grace", append([]string{"--route", "orders=nats", "--shutdown-grace", "0s"}, nats...)},
		{"zero attempts (would be the default 10)", "--max-attempts", append([]string{"--route", "orders=nats", "--max-attempts", "0"}, nats...)},
		{"zero workers", "--workers", append([]string{"--route", "orders=nats", "--workers", "0"}, nats...)},
		{"zero lease", "--lease-ttl", append([]string{"--route", "orders=nats", "--lease-ttl", "0s"}, nats...)},
		{"config with a second object", "want one JSON object", []string{"--config", badConfig}},
	} {
		args := append([]string{"relay", "--migrate"}, tc.args...)
		r := runIdemq(t, url, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: idemq %v: exit %d, stderr %q; want exit 2 naming %q", tc.name, args, r.code, r.stderr, tc.want)
		}
		unreachable := append([]string{"--database-url", "postgres://postgres@127.0.0.1:1/none", "--connect-timeout", "3s"}, args...)
		if r := runIdemq(t, url, unreachable...); r.code != exitUsage {
			t.Errorf("%s with the database unreachable: exit %d, want 2\nstderr: %s", tc.name, r.code, r.stderr)
		}
	}
	r := wantCode(t, url, exitPending, "migrate", "validate")
	if strings.Contains(r.stdout, "20") { // an applied_at timestamp
		t.Fatalf("a refused relay --migrate applied migrations:\n%s", r.stdout)
	}
}

// TestBadInputRefusedValuesNameTheirFlag: a value a library constructor
// refuses is reported by the flag that set it, not the Go field, and a
// "leave it 0 for the default" meant for Go callers is said as leaving the
// flag out (--lease-ttl 0s is refused). Table and schema flags are usage
// errors whether or not the database answers.
func TestBadInputRefusedValuesNameTheirFlag(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	unreachable := []string{"--database-url", "postgres://postgres@127.0.0.1:1/none", "--connect-timeout", "3s"}
	nats := []string{"--route", "orders=nats", "--nats-url", "nats://127.0.0.1:1"}
	for _, tc := range []struct{ flag, value, field string }{
		{"lease-ttl", "50ms", "LeaseTTL"},
		{"poll-interval", "1us", "PollInterval"},
		{"stats-interval", "5ms", "StatsInterval"},
	} {
		args := append([]string{"relay", "--" + tc.flag, tc.value}, nats...)
		for _, db := range [][]string{{"--database-url", url}, unreachable} {
			r := runIdemq(t, url, append(db, args...)...)
			want := "--" + tc.flag + ": " + strings.Replace(tc.value, "us", "µs", 1) + " is below the minimum of "
			if r.code != exitUsage || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "leave --"+tc.flag+" out for the default") ||
				strings.Contains(r.stderr, "leave it 0") || strings.Contains(r.stderr, tc.field) {
				t.Errorf("idemq %v: exit %d, stderr %q; want exit 2 naming --%s and to leave it out", args, r.code, r.stderr, tc.flag)
			}
		}
		// What the message says to do works: the flag given as 0 is refused
		// (it would silently be the default), and naming it.
		r := runIdemq(t, url, append(unreachable, append([]string{"relay", "--" + tc.flag, "0s"}, nats...)...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--"+tc.flag) || !strings.Contains(r.stderr, "leave it out for the default") {
			t.Errorf("--%s 0s: exit %d, stderr %q; want exit 2 saying to leave it out", tc.flag, r.code, r.stderr)
		}
	}
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"schema", []string{"stats"}},
		{"outbox-table", []string{"stats"}},
		{"inbox-table", []string{"dlq", "list", "--inbox"}},
		{"webhook-table", []string{"webhook", "list"}},
		{"outbox-table", append([]string{"relay"}, nats...)},
		{"requests-table", []string{"gc"}},
	} {
		var args []string
		if tc.flag == "requests-table" {
			args = append(append([]string{}, tc.args...), "--requests-table", "bad name")
		} else {
			args = append([]string{"--" + tc.flag, "bad name"}, tc.args...)
		}
		for _, db := range [][]string{{"--database-url", url}, unreachable} {
			r := runIdemq(t, url, append(db, args...)...)
			if r.code != exitUsage || !strings.HasPrefix(r.stderr, "idemq: --"+tc.flag+": ") || strings.Contains(r.stderr, "Table") {
				t.Errorf("idemq %v (%s): exit %d, stderr %q; want exit 2 naming --%s", args, db[1], r.code, r.stderr, tc.flag)
			}
		}
	}
}

// TestBadInputConfigFileWithOneObjectIsRead: the check for trailing data accepts a
// well-formed file with trailing blanks.
func TestBadInputConfigFileWithOneObjectIsRead(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "relay.json")
	if err := os.WriteFile(path, []byte("{\"routes\": [\"orders.*=nats\"], \"nats_url\": \"nats://127.0.0.1:1\"}\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// It gets past the flags to the database, which does not answer.
	r := runIdemq(t, "postgres://postgres@127.0.0.1:1/none", "--connect-timeout", "3s", "relay", "--config", path)
	if r.code != exitUnreachable {
		t.Fatalf("relay --config with one object: exit %d, want 3 (database unreachable)\nstderr: %s", r.code, r.stderr)
	}
}

// TestBadInputConnectTimeoutThatRoundsToNothingIsRefused: --connect-timeout 1ns
// reported every database as unreachable (exit 3).
func TestBadInputConnectTimeoutThatRoundsToNothingIsRefused(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	for _, d := range []string{"1ns", "0s", "-1s"} {
		r := wantCode(t, url, exitUsage, "--connect-timeout", d, "stats")
		if !strings.Contains(r.stderr, "--connect-timeout") {
			t.Errorf("--connect-timeout %s: stderr %q does not name the flag", d, r.stderr)
		}
	}
}

// TestBadInputWebhookCommandsHideURLCredentials: a password (or a token as the
// user) in an endpoint URL is not printed by add, list, enable or
// disable.
func TestBadInputWebhookCommandsHideURLCredentials(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	mustRun(t, url, "migrate", "--components", "outbox,webhook") // enable makes the held rows due
	outputs := []string{
		mustRun(t, url, "webhook", "add", "--id", "partner", "--url", "https://alice:s3cret@partner.example/hook"),
		mustRun(t, url, "--json", "webhook", "add", "--id", "token", "--url", "https://tok3n@partner.example/hook"),
		mustRun(t, url, "webhook", "list"),
		mustRun(t, url, "--json", "webhook", "list"),
		mustRun(t, url, "webhook", "disable", "partner"),
		mustRun(t, url, "--json", "webhook", "enable", "partner"),
	}
	for _, out := range outputs {
		for _, secret := range []string{"s3cret", "alice", "tok3n"} {
			if strings.Contains(out, secret) {
				t.Errorf("output shows %q:\n%s", secret, out)
			}
		}
	}
	if !strings.Contains(outputs[2], "https://xxxxx@partner.example/hook") {
		t.Errorf("webhook list does not show the redacted URL:\n%s", outputs[2])
	}
}

// TestBadInputWebhookAddRefusesNumbersItCannotKeep: NaN and infinite rates, a
// timeout under the registry's millisecond (stored as 0, the default) and
// a negative concurrency are usage errors, and nothing is registered.
func TestBadInputWebhookAddRefusesNumbersItCannotKeep(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	mustRun(t, url, "migrate", "--components", "webhook")
	for _, flags := range [][]string{
		{"--rate-limit", "NaN"}, {"--rate-limit", "+Inf"}, {"--rate-limit", "-Inf"}, {"--rate-limit", "-1"},
		{"--timeout", "999us"}, {"--timeout", "0s"}, {"--timeout", "-1s"},
		{"--concurrency", "-1"}, {"--concurrency", "0"}, {"--concurrency", "2147483648"},
	} {
		args := append([]string{"webhook", "add", "--url", "https://partner.example/hook"}, flags...)
		r := wantCode(t, url, exitUsage, args...)
		if !strings.Contains(r.stderr, flags[0]) {
			t.Errorf("idemq %v: stderr %q does not name %s", args, r.stderr, flags[0])
		}
	}
	var eps []endpointJSON
	mustJSON(t, url, &eps, "webhook", "list")
	if len(eps) != 0 {
		t.Fatalf("refused adds registered %d endpoints: %+v", len(eps), eps)
	}
}

// TestBadInputUnmigratedDatabaseSaysToMigrate: every command that needs the
// tables says to run `idemq migrate` and exits 4, instead of printing a
// raw "relation does not exist (SQLSTATE 42P01)"; stats reports what is
// migrated and names what is not.
func TestBadInputUnmigratedDatabaseSaysToMigrate(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	id := uuid.Must(uuid.NewV7()).String()
	for _, args := range [][]string{
		{"stats"},
		{"dlq", "list"},
		{"dlq", "list", "--inbox"},
		{"dlq", "list", "--inbox", "--conflicts"},
		{"dlq", "show", id},
		{"dlq", "show", "--inbox", "billing", "k1"},
		{"dlq", "replay", "--id", id},
		{"dlq", "purge", "--all"},
		{"dlq", "purge", "--inbox", "--scope", "billing"},
		{"gc"},
		{"webhook", "list"},
		{"webhook", "add", "--url", "https://partner.example/hook"},
		{"webhook", "disable", "partner"},
		{"--schema", "nowhere", "dlq", "list"},
	} {
		r := wantCode(t, url, exitPending, args...)
		if !strings.Contains(r.stderr, "run `idemq migrate") || strings.Contains(r.stderr, "SQLSTATE") {
			t.Errorf("idemq %v: stderr %q, want it to say to run idemq migrate", args, r.stderr)
		}
	}

	mustRun(t, url, "migrate", "--components", "inbox")
	var stats map[string]any
	mustJSON(t, url, &stats, "stats")
	if _, ok := stats["outbox_pending"]; ok || stats["inbox_records"] != float64(0) || fmt.Sprint(stats["not_migrated"]) != "[outbox]" {
		t.Errorf("stats with only the inbox migrated: %v; want the inbox's counts and not_migrated [outbox]", stats)
	}
	if out := mustRun(t, url, "stats"); !strings.Contains(out, "outbox: not migrated (run `idemq migrate --components outbox`") {
		t.Errorf("stats table with only the inbox migrated:\n%s", out)
	}
}

// TestVersion: `idemq version`, --json version and --version say which
// build this is.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		r := wantCode(t, "", exitOK, args...)
		if !strings.Contains(r.stdout, "idemq ") || !strings.Contains(r.stdout, runtime.Version()) || !strings.Contains(r.stdout, "commit ") {
			t.Errorf("idemq %v: %q, want the module version, commit and %s", args, r.stdout, runtime.Version())
		}
	}
	var v versionInfo
	mustJSON(t, "", &v, "version")
	if v.Version == "" || v.Commit == "" || v.Go != runtime.Version() {
		t.Errorf("idemq --json version: %+v", v)
	}
}

// TestBadInputWebhookEnableWithoutOutboxChangesNothing: on a database with the
// webhook tables but not the outbox's, `webhook enable` cannot make the
// held rows due; it says to migrate (exit 4) and leaves the endpoint
// disabled, instead of enabling it and then failing.
func TestBadInputWebhookEnableWithoutOutboxChangesNothing(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	mustRun(t, url, "migrate", "--components", "webhook")
	mustRun(t, url, "webhook", "add", "--id", "partner", "--url", "https://partner.example/hook")
	mustRun(t, url, "webhook", "disable", "partner", "--reason", "maintenance")
	r := wantCode(t, url, exitPending, "webhook", "enable", "partner")
	if !strings.Contains(r.stderr, "idemq migrate") {
		t.Errorf("webhook enable without the outbox: stderr %q does not say to run `idemq migrate`", r.stderr)
	}
	var eps []struct {
		ID      string `json:"id"`
		Enabled bool   `json:"enabled"`
	}
	mustJSON(t, url, &eps, "webhook", "list")
	if len(eps) != 1 || eps[0].ID != "partner" || eps[0].Enabled {
		t.Errorf("after the failed enable the endpoints are %+v, want partner still disabled", eps)
	}
	// Once the outbox is migrated the same command succeeds.
	mustRun(t, url, "migrate", "--components", "outbox")
	mustRun(t, url, "webhook", "enable", "partner")
	mustJSON(t, url, &eps, "webhook", "list")
	if len(eps) != 1 || !eps[0].Enabled {
		t.Errorf("after migrating the outbox, enable left %+v, want partner enabled", eps)
	}
}

// TestBadInputEmptyFlagValueIsAUsageError: an empty filter used to mean
// "no filter": dlq purge --class "" purged every outbox dead letter, and
// so did --destination, --destination-prefix, --key and --key-prefix, and
// --inbox with --scope, --key or --class; dlq replay --class "" replayed
// them all. An empty or blank value of any flag (where empty is not
// documented to mean something) is a usage error in every command, on the
// command line and in the environment, and nothing is touched.
func TestBadInputEmptyFlagValueIsAUsageError(t *testing.T) {
	t.Parallel()
	url, pool, ob := database(t)
	for _, dest := range []string{"payments", "payments", "emails"} {
		if err := ob.Enqueue(context.Background(), outbox.Message{Destination: dest, Key: dest, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	deadLetter(t, pool, ob, 3)
	ib := inboxDeadLetterSet(t, pool, "billing", "order-1", "order-2")
	var cases [][]string
	for _, verb := range []string{"purge", "replay", "list", "groups", "classify"} {
		for _, flag := range []string{"--class", "--destination", "--destination-prefix", "--key", "--key-prefix", "--group", "--id"} {
			for _, empty := range []string{"", " "} {
				cases = append(cases, []string{"dlq", verb, flag, empty})
			}
		}
		for _, flag := range []string{"--scope", "--key", "--class", "--id", "--group"} {
			cases = append(cases, []string{"dlq", verb, "--inbox", flag, ""}, []string{"dlq", verb, "--inbox", "--conflicts", flag, " "})
		}
	}
	cases = append(cases,
		[]string{"dlq", "purge", "--yes", "--class", ""},
		[]string{"dlq", "purge", "--destination", "payments", "--key", ""},
		[]string{"dlq", "purge", "--id", "", "--id", "", "--dry-run"},
		[]string{"dlq", "show", "--inbox", "", ""},
		[]string{"dlq", "show", "--inbox", "billing", " "},
		[]string{"--schema", "", "dlq", "purge", "--all"},
		[]string{"dlq", "purge", "--all", "--outbox-table", ""},
		[]string{"dlq", "purge", "--inbox", "--all", "--inbox-table", " "},
		[]string{"gc", "--requests-table", ""},
		[]string{"ui", "--requests-table", ""},
		[]string{"webhook", "enable", ""},
		[]string{"webhook", "disable", " "},
		[]string{"webhook", "add", "--url", "http://example.com/", "--id", ""},
		[]string{"migrate", "--components", ""},
	)
	for _, args := range cases {
		r := wantCode(t, url, exitUsage, args...)
		if !strings.Contains(r.stderr, "empty") {
			t.Errorf("idemq %q: stderr %q does not say the value is empty", args, r.stderr)
		}
	}
	r := runWithEnv(t, env("DATABASE_URL="+url, "IDEMQ_OUTBOX_TABLE="), "dlq", "purge", "--all")
	if r.code != exitUsage || !strings.Contains(r.stderr, "empty") {
		t.Errorf("IDEMQ_OUTBOX_TABLE= dlq purge --all: exit %d, stderr %q; want a usage error saying it is empty", r.code, r.stderr)
	}
	if n := deadCount(t, ob); n != 3 {
		t.Fatalf("%d outbox dead letters left, want the 3 nothing was asked to touch", n)
	}
	for _, key := range []string{"order-1", "order-2"} {
		if rec, err := ib.Get(context.Background(), "billing", key); err != nil || rec.Status != inbox.FailedFinal {
			t.Fatalf("%s is %+v, %v; want it still a dead letter", key, rec, err)
		}
	}
}

// TestBadInputRelaySizesAndKafkaTxNames: --batch-size 2147483648 crashed
// the relay with out of memory and passed --check; kafka-tx routes
// defaulted to a transactional id prefix and a watermark topic shared by
// every outbox on the cluster, and --check took an empty prefix, a
// watermark topic Kafka refuses, and a route into the watermark topic.
// Each is a usage error, with --check and without it, whether or not the
// database answers.
func TestBadInputRelaySizesAndKafkaTxNames(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	nats := []string{"--route", "orders=nats", "--nats-url", "nats://127.0.0.1:1"}
	tx := []string{"--route", "pay.*=kafka-tx", "--kafka-brokers", "127.0.0.1:1"}
	named := slices.Concat(tx, []string{"--kafka-tx-id-prefix", "billing-outbox-"})
	dir := t.TempDir()
	noNames := filepath.Join(dir, "no-names.json")
	if err := os.WriteFile(noNames, []byte(`{"routes": ["pay.*=kafka-tx"], "kafka_brokers": ["127.0.0.1:1"], "kafka_tx_id_prefix": ""}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		want string
		args []string
	}{
		{"--batch-size: 2147483648 is above the maximum of", append([]string{"--batch-size", "2147483648"}, nats...)},
		{"--batch-size: 10001 is above the maximum of 10000", append([]string{"--batch-size", "10001"}, nats...)},
		{"--workers: 65 is above the maximum of 64", append([]string{"--workers", "65"}, nats...)},
		{"--publish-timeout: 1ns is below the minimum", append([]string{"--publish-timeout", "1ns"}, nats...)},
		{"--publish-timeout: 2h0m0s is above the maximum", append([]string{"--publish-timeout", "2h"}, nats...)},
		{"--publish-timeout 0s: want a positive duration", append([]string{"--publish-timeout", "0s"}, nats...)},
		{"--lease-ttl: 2h0m0s is above the maximum", append([]string{"--lease-ttl", "2h"}, nats...)},
		{"need --kafka-tx-id-prefix and --kafka-watermark-topic", tx},
		{"need --kafka-tx-id-prefix and --kafka-watermark-topic", slices.Concat(tx, []string{"--kafka-watermark-topic", "billing-outbox-watermarks"})},
		{"need --kafka-tx-id-prefix and --kafka-watermark-topic", named},
		{"need --kafka-tx-id-prefix and --kafka-watermark-topic", []string{"--config", noNames}},
		{"--kafka-tx-id-prefix \"\": the value is empty", slices.Concat(tx, []string{"--kafka-tx-id-prefix", "", "--kafka-watermark-topic", "wm"})},
		{"--kafka-watermark-topic \"\": the value is empty", slices.Concat(named, []string{"--kafka-watermark-topic", ""})},
		{"Kafka allows ASCII letters", slices.Concat(named, []string{"--kafka-watermark-topic", "bad topic!"})},
		{"at most 249", slices.Concat(named, []string{"--kafka-watermark-topic", strings.Repeat("w", 300)})},
		{`"." is not a Kafka topic name`, slices.Concat(named, []string{"--kafka-watermark-topic", "."})},
		{`".." is not a Kafka topic name`, slices.Concat(named, []string{"--kafka-watermark-topic", ".."})},
		{"publishes into the watermark topic", slices.Concat(named, []string{"--kafka-watermark-topic", "wm", "--route", "audit=kafka-tx:wm"})},
		{"publishes into the watermark topic", slices.Concat(named, []string{"--kafka-watermark-topic", "wm", "--route", "wm=franz"})},
		{"TARGET topic \"orders/eu\" holds '/'", []string{"--route", "orders=kafka:orders/eu", "--kafka-brokers", "127.0.0.1:1"}},
	} {
		for _, check := range []string{"--check", "--migrate"} {
			args := append([]string{"relay", check}, tc.args...)
			for _, db := range [][]string{{"--database-url", url}, {"--database-url", unreachableDB, "--connect-timeout", "3s"}} {
				r := runIdemq(t, url, append(db, args...)...)
				if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
					t.Errorf("idemq %q: exit %d, stderr %q; want exit 2 saying %q", append(db, args...), r.code, r.stderr, tc.want)
				}
			}
		}
	}
	r := runWithEnv(t, env("DATABASE_URL="+unreachableDB, "IDEMQ_RELAY_BATCH_SIZE=2147483648"), append([]string{"relay", "--check"}, nats...)...)
	if r.code != exitUsage || !strings.Contains(r.stderr, "--batch-size") {
		t.Errorf("IDEMQ_RELAY_BATCH_SIZE=2147483648 relay --check: exit %d, stderr %q; want exit 2 naming --batch-size", r.code, r.stderr)
	}
	wantCode(t, url, exitPending, "migrate", "validate") // nothing was migrated

	// The largest values are taken, and --check prints every setting.
	var got relayCheck
	mustJSON(t, unreachableDB, &got, append([]string{"relay", "--check", "--batch-size", "10000", "--workers", "64", "--publish-timeout", "1h",
		"--kafka-tx-id-prefix", "billing-outbox-", "--kafka-watermark-topic", "billing-outbox-watermarks"}, tx...)...)
	if got.BatchSize != 10000 || got.Workers != 64 || got.PublishTimeout != "1h0m0s" || got.LeaseTTL != "10s" ||
		got.KafkaTxIDPrefix != "billing-outbox-" || got.KafkaWatermarkTopic != "billing-outbox-watermarks" {
		t.Errorf("relay --check --json: %+v, want the sizes, timeouts and kafka-tx names given", got)
	}
}

// TestRelayHelpIsTruthful: the help explains a route's TARGET, gives the
// maxima, has --publish-timeout, and says how long a relay stalled in the
// middle of a batch holds its partitions (publish timeout + lease/3, 33s
// on the defaults), not only the 10s lease.
func TestRelayHelpIsTruthful(t *testing.T) {
	t.Parallel()
	help := mustRun(t, unreachableDB, "relay", "--help")
	for _, want := range []string{"TARGET is the Kafka topic", "the topic or subject to publish to", "--publish-timeout",
		"IDEMQ_RELAY_PUBLISH_TIMEOUT", "--publish-timeout + --lease-ttl/3 (33s on the defaults)", "rows per claim (at most 10000)",
		"batches in flight at once (at most 64)", "required with them"} {
		if !strings.Contains(strings.Join(strings.Fields(help), " "), want) {
			t.Errorf("relay --help does not say %q:\n%s", want, help)
		}
	}
}

// TestBadInputSettingsAreNotIgnored: settings that were accepted and
// ignored are usage errors, before anything is applied: an inbox
// partition interval without a partitioned layout; a plain migrate of a
// partitioned inbox, which said "nothing to apply" while its consumers'
// plain Config failed every claim; ui --requests-table 'Bad;Name', which
// left the lookups out without a word; arguments to a command that takes
// none (ui started anyway); a gc batch above its maximum.
func TestBadInputSettingsAreNotIgnored(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	for _, tc := range []struct {
		want string
		args []string
	}{
		{"--inbox-partition-interval applies to a partitioned inbox", []string{"migrate", "--inbox-partition-interval", "1h"}},
		{"--inbox-partition-interval applies to a partitioned inbox", []string{"--inbox-partition-interval", "1h", "gc"}},
		{"--inbox-partition-interval applies to a partitioned inbox", []string{"relay", "--check", "--webhooks", "--inbox-partition-interval", "1h"}},
		{"--requests-table: invalid table name", []string{"ui", "--listen", freeAddr(t), "--requests-table", "Bad;Name"}},
		{"--requests-table: invalid table name", []string{"migrate", "--components", "requests", "--requests-table", "Bad;Name"}},
		{"takes no arguments", []string{"ui", "--listen", freeAddr(t), "extra"}},
		{"takes no arguments", []string{"stats", "extra"}},
		{"takes no arguments", []string{"dlq", "list", "--inbox", "extra"}},
		{"takes no arguments", []string{"migrate", "validate", "extra"}},
		{"--batch-size 100001: want 1 to 100000", []string{"gc", "--batch-size", "100001"}},
		{"--batch-size 2147483648: want 1 to 100000", []string{"gc", "--batch-size", "2147483648"}},
	} {
		r := wantCode(t, url, exitUsage, tc.args...)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("idemq %q: stderr %q, want it to say %q", tc.args, r.stderr, tc.want)
		}
	}
	wantCode(t, url, exitPending, "migrate", "validate") // nothing was applied

	mustRun(t, url, "--inbox-partitioned", "arrival", "migrate")
	for _, args := range [][]string{{"migrate"}, {"migrate", "--components", "inbox"}} {
		r := wantCode(t, url, exitUsage, args...)
		if !strings.Contains(r.stderr, "is partitioned") || strings.Contains(r.stdout, "nothing to apply") {
			t.Errorf("plain idemq %q on a partitioned inbox: stdout %q, stderr %q; want it refused, saying the table is partitioned",
				args, r.stdout, r.stderr)
		}
	}
	mustRun(t, url, "migrate", "--components", "outbox,webhook") // without the inbox, its layout does not matter
	if out := mustRun(t, url, "--inbox-partitioned", "arrival", "migrate"); !strings.Contains(out, "nothing to apply") {
		t.Errorf("migrate with the table's layout: %q", out)
	}
}

// TestDLQOnAConsumerOnlyDatabaseSaysInbox: on a database with the inbox's
// tables and no outbox, the dlq commands said to migrate; they say to add
// --inbox (as idemq stats does), and the reverse with --inbox on an
// outbox alone.
func TestDLQOnAConsumerOnlyDatabaseSaysInbox(t *testing.T) {
	t.Parallel()
	consumerOnly := testenv.PostgresURL(t)
	mustRun(t, consumerOnly, "migrate", "--components", "inbox")
	for _, args := range [][]string{{"dlq", "groups"}, {"dlq", "list"}, {"dlq", "replay"}, {"dlq", "purge", "--all"},
		{"dlq", "show", "0193a1b2-0000-7000-8000-000000000001"}} {
		r := wantCode(t, consumerOnly, exitPending, args...)
		if !strings.Contains(r.stderr, "add --inbox") {
			t.Errorf("idemq %q on a consumer-only database: stderr %q, want the hint --inbox", args, r.stderr)
		}
	}
	mustRun(t, consumerOnly, "dlq", "groups", "--inbox")

	relayOnly := testenv.PostgresURL(t)
	mustRun(t, relayOnly, "migrate", "--components", "outbox")
	for _, args := range [][]string{{"dlq", "groups", "--inbox"}, {"dlq", "show", "--inbox", "billing", "order-1"}} {
		if r := wantCode(t, relayOnly, exitPending, args...); !strings.Contains(r.stderr, "drop --inbox") {
			t.Errorf("idemq %q on an outbox alone: stderr %q, want the hint to drop --inbox", args, r.stderr)
		}
	}
}
