package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
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
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

func TestMigrateValidateExitCodes(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)

	r := wantCode(t, url, exitPending, "migrate", "validate")
	if !strings.Contains(r.stdout, "public.idemq_outbox") || !strings.Contains(r.stdout, "partitions") || !strings.Contains(r.stdout, "pending") {
		t.Errorf("validate lists no pending outbox migration:\n%s", r.stdout)
	}
	var report struct {
		Current bool        `json:"current"`
		Pending []migration `json:"pending"`
	}
	r = wantCode(t, url, exitPending, "--json", "migrate", "validate") // the exit code holds with --json too
	if err := json.Unmarshal([]byte(r.stdout), &report); err != nil || report.Current || len(report.Pending) < 2 {
		t.Fatalf("validate --json on an empty database: %+v, %v; want the outbox's and the inbox's migrations pending", report, err)
	}
	n := len(report.Pending)
	// validate changed nothing: still pending.
	wantCode(t, url, exitPending, "migrate", "validate", "--components", "inbox")

	var applied []migration
	mustJSON(t, url, &applied, "migrate")
	if len(applied) != n {
		t.Fatalf("migrate applied %d migrations, want the %d validate listed: %+v", len(applied), n, applied)
	}
	mustJSON(t, url, &report, "migrate", "validate")
	if !report.Current || len(report.Pending) != 0 {
		t.Errorf("after migrate, validate says %+v", report)
	}
	var list []migration
	mustJSON(t, url, &list, "migrate", "list")
	for _, m := range list {
		if m.AppliedAt == nil {
			t.Errorf("migration %s %s listed as pending after migrate", m.Component, m.Name)
		}
	}
	if len(list) != n {
		t.Errorf("migrate list: %d migrations, want %d", len(list), n)
	}
	if out := mustRun(t, url, "migrate"); !strings.Contains(out, "schema is current") {
		t.Errorf("a second migrate: %q, want it to say the schema is current", out)
	}

	// Other tables in another schema are migrated and validated apart.
	other := []string{"--schema", "billing", "--outbox-table", "billing_outbox", "--inbox-table", "billing_inbox"}
	wantCode(t, url, exitPending, append(other, "migrate", "validate")...)
	mustRun(t, url, append(other, "migrate")...)
	wantCode(t, url, exitOK, append(other, "migrate", "validate")...)
	wantCode(t, url, exitUsage, "--outbox-table", "Bad-Name", "migrate")
}

// TestMigrateExport: migrate export writes the numbered files with the
// flags' names filled in, needs no database to do it, adds nothing the
// second time, and a database migrated by applying the files with plain
// Exec is current for migrate validate.
func TestMigrateExport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	export := []string{"--schema", "billing", "migrate", "export", "--components", "outbox,inbox,webhook", dir}
	validate := []string{"--schema", "billing", "migrate", "validate", "--components", "outbox,inbox,webhook"}
	var files []string
	mustJSON(t, "postgres://127.0.0.1:1/unreachable", &files, export...)
	// An up and a down file for each migration of the three stores, the
	// webhook registry's last.
	var ups []string
	for _, store := range []string{"outbox", "internal/inboxsql", "transports/webhook/endpoints"} {
		found, err := filepath.Glob(filepath.Join("..", "..", store, "migrations", "*.up.sql"))
		if err != nil {
			t.Fatal(err)
		}
		ups = append(ups, found...)
	}
	last := strings.TrimSuffix(filepath.Base(ups[len(ups)-1]), ".up.sql")
	_, lastName, _ := strings.Cut(last, "_")
	if len(files) != 2*len(ups) || files[0] != "0001_idemq_outbox_outbox.up.sql" ||
		files[len(files)-1] != fmt.Sprintf("%04d_idemq_webhook_endpoints_%s.down.sql", len(ups), lastName) {
		t.Fatalf("export wrote %v, want an up and a down file for each of %d migrations", files, len(ups))
	}
	if out := mustRun(t, "", export...); !strings.Contains(out, "nothing to export") {
		t.Errorf("a second export: %q, want it to say there is nothing to export", out)
	}
	wantCode(t, "", exitUsage, "migrate", "export")
	wantCode(t, "", exitUsage, "migrate", "export", "--format", "liquibase", t.TempDir())
	if out := mustRun(t, "", "migrate", "export", "--format", "flyway", t.TempDir()); !regexp.MustCompile(`\bV\d{4}__idemq_inbox_conflicts\.sql\b`).MatchString(out) {
		t.Errorf("export --format flyway wrote:\n%s", out)
	}

	url := testenv.PostgresURL(t)
	wantCode(t, url, exitPending, validate...)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, f := range files {
		if !strings.HasSuffix(f, ".up.sql") {
			continue
		}
		sql, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(sql), `"billing".`) {
			t.Errorf("%s does not name the schema billing", f)
		}
		if _, err := pool.Exec(context.Background(), string(sql)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	wantCode(t, url, exitOK, validate...)
	// The outbox's SQL enqueue function came with the export.
	var id string
	if err := pool.QueryRow(context.Background(), `SELECT billing.idemq_outbox_enqueue('orders', 'k', 'x')::text`).Scan(&id); err != nil {
		t.Fatalf("the exported outbox has no working enqueue function: %v", err)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	for _, tc := range []struct {
		name string
		code int
		args []string
	}{
		// First, while the database is empty.
		{"relay with pending migrations", exitPending, []string{"relay", "--route", "orders=nats", "--nats-url", "nats://127.0.0.1:1"}},
		{"unknown flag", exitUsage, []string{"stats", "--no-such-flag"}},
		{"bad flag value", exitUsage, []string{"relay", "--batch-size", "many"}},
		{"unknown command", exitUsage, []string{"frobnicate"}},
		{"unknown subcommand", exitUsage, []string{"dlq", "frobnicate"}},
		{"unknown sink", exitUsage, []string{"relay", "--migrate", "--route", "orders=rabbitmq"}},
		{"route without broker", exitUsage, []string{"relay", "--migrate", "--route", "orders=kafka"}},
		{"no routes", exitUsage, []string{"relay", "--migrate"}},
		{"bad log format", exitUsage, []string{"relay", "--log-format", "xml", "--route", "orders=nats"}},
		{"bad log level", exitUsage, []string{"relay", "--log-level", "loud", "--route", "orders=nats"}},
		{"bad message id", exitUsage, []string{"dlq", "show", "not-a-uuid"}},
		{"database unreachable", exitUnreachable, []string{"--database-url", "postgres://postgres@127.0.0.1:1/none", "--connect-timeout", "3s", "stats"}},
	} {
		r := runIdemq(t, url, tc.args...)
		if r.code != tc.code {
			t.Errorf("%s: idemq %v exit %d, want %d\nstderr: %s", tc.name, tc.args, r.code, tc.code, r.stderr)
		}
		if tc.code != exitOK && !strings.HasPrefix(r.stderr, "idemq: ") {
			t.Errorf("%s: stderr %q does not say what went wrong", tc.name, r.stderr)
		}
	}
}

// The libpq variables reach the binary through pgx's own parsing when no
// URL is given.
func TestLibpqEnvironment(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cmd := []string{"PGHOST=" + u.Hostname(), "PGPORT=" + u.Port(), "PGUSER=" + u.User.Username(),
		"PGDATABASE=" + strings.TrimPrefix(u.Path, "/"), "PGSSLMODE=disable"}
	r := runWithEnv(t, env(cmd...), "migrate")
	if r.code != exitOK {
		t.Fatalf("migrate with PG* variables: exit %d: %s", r.code, r.stderr)
	}
	if r := runWithEnv(t, env(cmd...), "migrate", "validate"); r.code != exitOK {
		t.Fatalf("validate with PG* variables: exit %d: %s", r.code, r.stderr)
	}
}

func TestDeadLettersRoundTrip(t *testing.T) {
	t.Parallel()
	url, pool, ob := database(t)
	ctx := context.Background()

	var ids []string
	for i, dest := range []string{"payments", "payments", "payments", "emails", "emails"} {
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: fmt.Sprint("k", i%2), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		if err := ob.Enqueue(ctx, m); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID.String())
	}
	deadLetter(t, pool, ob, 5)

	var all []deadLetterJSON
	mustJSON(t, url, &all, "dlq", "list")
	if got := deadIDs(all); !slices.Equal(got, ids) {
		t.Fatalf("dlq list ids %v, want %v", got, ids)
	}
	var payments []deadLetterJSON
	mustJSON(t, url, &payments, "dlq", "list", "--destination", "payments")
	if got := deadIDs(payments); !slices.Equal(got, ids[:3]) {
		t.Fatalf("dlq list --destination payments: %v, want %v", got, ids[:3])
	}
	var shown deadLetterJSON
	mustJSON(t, url, &shown, "dlq", "show", ids[3])
	if shown.ID.String() != ids[3] || shown.PayloadText == nil || *shown.PayloadText != `{"n":3}` || !strings.Contains(shown.LastError, "refused") {
		t.Errorf("dlq show: %+v", shown)
	}
	if out := mustRun(t, url, "dlq", "list"); !strings.Contains(out, "5 outbox dead letters") || !strings.Contains(out, "refused") {
		t.Errorf("dlq list table:\n%s", out)
	}
	wantCode(t, url, exitNotFound, "dlq", "show", uuid.Must(uuid.NewV7()).String())

	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "replay", "--destination", "payments")
	if moved["replayed"] != 3 {
		t.Fatalf("dlq replay: %v, want 3 replayed", moved)
	}
	var stats statsReport
	mustJSON(t, url, &stats, "stats")
	if stats.OutboxPending != 3 || stats.OutboxDead != 2 {
		t.Errorf("stats after replay: %+v, want 3 pending and 2 dead", stats)
	}
	mustJSON(t, url, &moved, "dlq", "purge", "--older-than", "1h")
	if moved["purged"] != 0 {
		t.Errorf("dlq purge --older-than 1h purged %d fresh dead letters", moved["purged"])
	}
	mustJSON(t, url, &moved, "dlq", "purge", "--destination", "emails")
	if moved["purged"] != 2 {
		t.Errorf("dlq purge --destination emails: %v, want 2", moved)
	}
	wantCode(t, url, exitNotFound, "dlq", "replay", "--destination", "emails")
	mustJSON(t, url, &stats, "stats")
	if stats.OutboxPending != 3 || stats.OutboxDead != 0 {
		t.Errorf("stats after purge: %+v, want 3 pending and none dead", stats)
	}

	// The replayed messages are published with their original ids.
	got := drain(t, pool, ob, 3)
	slices.Sort(got)
	if !slices.Equal(got, ids[:3]) {
		t.Errorf("replayed messages published as %v, want %v", got, ids[:3])
	}
}

func TestInboxDeadLetters(t *testing.T) {
	t.Parallel()
	url, pool, _ := database(t)
	ctx := context.Background()
	// Two messages whose handler fails three times become dead letters.
	declined := true
	billing, err := consumer.New(pool, "billing", func(context.Context, pgx.Tx, *consumer.Message) error {
		if declined {
			return errors.New("card declined")
		}
		return nil
	}, consumer.Config{Retry: idemq.Retry{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ib := billing.Store()
	for _, key := range []string{"order-1", "order-2"} {
		if r := billing.Process(ctx, &consumer.Message{ID: key, Payload: []byte("fp")}); r.Outcome != consumer.DeadLettered {
			t.Fatalf("%s: %+v, want DeadLettered", key, r)
		}
	}
	var dead []inboxDead
	mustJSON(t, url, &dead, "dlq", "list", "--inbox", "--scope", "billing")
	if len(dead) != 2 || dead[0].Key != "order-1" || dead[0].Failures != 3 || dead[0].LastError != "card declined" {
		t.Fatalf("dlq list --inbox: %+v", dead)
	}
	var one inboxDead
	mustJSON(t, url, &one, "dlq", "show", "--inbox", "billing", "order-2")
	if one.Key != "order-2" || one.Scope != "billing" {
		t.Errorf("dlq show --inbox: %+v", one)
	}
	wantCode(t, url, exitNotFound, "dlq", "show", "--inbox", "billing", "order-3")
	wantCode(t, url, exitUsage, "dlq", "list", "--inbox", "--destination", "x")

	var moved map[string]int64
	mustJSON(t, url, &moved, "dlq", "replay", "--inbox", "--scope", "billing", "--key", "order-1")
	if moved["replayed"] != 1 {
		t.Fatalf("dlq replay --inbox: %v", moved)
	}
	if rec, err := ib.Get(ctx, "billing", "order-1"); err != nil || rec.Status != inbox.FailedRetryable || rec.Failures != 0 {
		t.Errorf("released record: %+v, %v; want FAILED_RETRYABLE with no failures", rec, err)
	}
	// The next delivery of a released message is applied.
	declined = false
	if r := billing.Process(ctx, &consumer.Message{ID: "order-1", Payload: []byte("fp")}); r.Outcome != consumer.Applied {
		t.Errorf("delivery after release: %+v, want Applied", r)
	}
	mustJSON(t, url, &moved, "dlq", "purge", "--inbox", "--scope", "billing")
	if moved["purged"] != 1 {
		t.Errorf("dlq purge --inbox: %v, want 1", moved)
	}
	if _, err := ib.Get(ctx, "billing", "order-2"); !errors.Is(err, inbox.ErrNotFound) {
		t.Errorf("purged record: %v, want ErrNotFound", err)
	}
	wantCode(t, url, exitNotFound, "dlq", "purge", "--inbox", "--scope", "billing")

	// Conflicts: a key applied with one payload and delivered with another.
	if r := billing.Process(ctx, &consumer.Message{ID: "order-1", Payload: []byte("other")}); r.Outcome != consumer.Conflict {
		t.Fatalf("order-1 with another payload: %+v, want Conflict", r)
	}
	var stats statsReport
	mustJSON(t, url, &stats, "stats")
	if stats.InboxDead != 0 || stats.InboxConflicts != 1 {
		t.Errorf("stats: %+v, want no inbox dead letters and one conflict", stats)
	}
	var conflicts []inboxDead
	mustJSON(t, url, &conflicts, "dlq", "list", "--inbox", "--conflicts")
	if len(conflicts) != 1 || conflicts[0].Key != "order-1" || conflicts[0].Seen != 1 {
		t.Fatalf("dlq list --inbox --conflicts: %+v", conflicts)
	}
	wantCode(t, url, exitUsage, "dlq", "list", "--conflicts")
	mustJSON(t, url, &moved, "dlq", "purge", "--inbox", "--conflicts", "--scope", "billing")
	if moved["purged"] != 1 {
		t.Errorf("dlq purge --inbox --conflicts: %v, want 1", moved)
	}
}

func TestGC(t *testing.T) {
	t.Parallel()
	url, pool, _ := database(t)
	ctx := context.Background()
	shipping, err := consumer.New(pool, "shipping", func(context.Context, pgx.Tx, *consumer.Message) error { return nil },
		consumer.Config{Inbox: inbox.Config{Retention: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		if r := shipping.Process(ctx, &consumer.Message{ID: fmt.Sprint("k", i), Payload: []byte{}}); r.Outcome != consumer.Applied {
			t.Fatalf("k%d: %+v, want Applied", i, r)
		}
	}
	time.Sleep(10 * time.Millisecond) // let the 1 ms retention run out
	var out struct {
		Deleted int64 `json:"deleted"`
	}
	mustJSON(t, url, &out, "gc", "--batch-size", "10")
	if out.Deleted != 25 {
		t.Errorf("gc deleted %d, want 25", out.Deleted)
	}
	if out := mustRun(t, url, "gc"); !strings.Contains(out, "deleted 0 expired inbox records") {
		t.Errorf("second gc: %q", out)
	}
}

// deadLetter runs a relay whose Sink refuses everything until n messages
// are dead letters.
func deadLetter(t *testing.T, pool *pgxpool.Pool, ob *outbox.Outbox, n int) {
	t.Helper()
	dead := make(chan struct{}, n)
	r, err := relay.New(pool, ob, relay.SinkFunc(func(context.Context, relay.BatchID, []relay.Message) error {
		return idemq.Permanent(errors.New("refused by the test"))
	}), relay.Config{Hooks: relay.Hooks{OnDeadLettered: func(relay.DeadLetteredEvent) { dead <- struct{}{} }}})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		receive(t, dead)
	}
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}
}

// drain runs a relay until n messages were published and returns their ids
// in publishing order.
func drain(t *testing.T, pool *pgxpool.Pool, ob *outbox.Outbox, n int) []string {
	t.Helper()
	ids := make(chan string, n)
	r, err := relay.New(pool, ob, relay.SinkFunc(func(_ context.Context, _ relay.BatchID, batch []relay.Message) error {
		for _, m := range batch {
			ids <- m.ID.String()
		}
		return nil
	}), relay.Config{})
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for range n {
		out = append(out, receive(t, ids))
	}
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}
	return out
}

func deadIDs(dead []deadLetterJSON) []string {
	var out []string
	for _, d := range dead {
		out = append(out, d.ID.String())
	}
	return out
}

// TestMigrateToPartitionedInbox: migrate --inbox-partitioned moves a plain
// inbox holding records into the partitioned layout; its keys stay
// duplicates, and validate and gc work with the same flag.
func TestMigrateToPartitionedInbox(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	mustRun(t, url, "migrate")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	apply := func(layout inbox.Partitioning, key string) consumer.Outcome {
		t.Helper()
		c, err := consumer.New(pool, "billing", func(context.Context, pgx.Tx, *consumer.Message) error { return nil },
			consumer.Config{Inbox: inbox.Config{Partitioning: layout}})
		if err != nil {
			t.Fatal(err)
		}
		return c.Process(ctx, &consumer.Message{ID: key, Payload: []byte("fp")}).Outcome
	}
	if o := apply(inbox.Unpartitioned, "order-1"); o != consumer.Applied {
		t.Fatalf("before: %v", o)
	}
	flag := []string{"--inbox-partitioned", "arrival"}
	mustRun(t, url, append(flag, "migrate")...)
	wantCode(t, url, exitOK, append(flag, "migrate", "validate")...)
	mustRun(t, url, append(flag, "gc")...)
	if o := apply(inbox.PartitionByArrival, "order-1"); o != consumer.Duplicate {
		t.Fatalf("a key applied before the migration, after it: %v, want a duplicate", o)
	}
	if o := apply(inbox.PartitionByArrival, "order-2"); o != consumer.Applied {
		t.Fatalf("a new key after the migration: %v", o)
	}
	var parts int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'idemq_inbox'::regclass`).Scan(&parts); err != nil || parts < 3 {
		t.Fatalf("%d partitions, %v; want bucket 0 and the current ones", parts, err)
	}
}
