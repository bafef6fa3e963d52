package consumer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
)

// The crash tests run the consumer in a child process, the test binary
// itself started again with childEnv set, so it can be SIGKILLed like a
// real one. The child processes one delivery and prints its Result.
const (
	childEnv      = "IDEMQ_CONSUMER_CHILD" // "single" or "batch"
	childDSN      = "IDEMQ_CONSUMER_CHILD_DSN"
	childDelivery = "IDEMQ_CONSUMER_CHILD_DELIVERY"
	childFail     = "IDEMQ_CONSUMER_CHILD_FAIL"  // the handler fails
	childStuck    = "IDEMQ_CONSUMER_CHILD_STUCK" // the handler waits on the row of accounts
	childApp      = "IDEMQ_CONSUMER_CHILD_APP"   // application_name of its connections
	crashKey      = "order-crash"
)

// crashConfig is the consumer both parent and child run: Redeliver mode, as
// the NATS docs recommend, with few attempts so that counting crashes as
// attempts would dead-letter the message.
var crashConfig = consumer.Config{Redeliver: true, Retry: idemq.Retry{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	os.Exit(m.Run())
}

// runChild is the consumer process of the crash tests.
func runChild(mode string) int {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(childDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(childApp)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	if mode == "linear" {
		return linearChild(pool)
	}
	fail, stuck := os.Getenv(childFail) != "", os.Getenv(childStuck) != ""
	c, err := consumer.New(pool, "billing", func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		if stuck {
			if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts FOR UPDATE`); err != nil {
				return err
			}
		}
		if fail {
			return errors.New("the handler failed")
		}
		return nil
	}, crashConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	delivery, _ := strconv.Atoi(os.Getenv(childDelivery))
	m := &consumer.Message{ID: crashKey, Payload: []byte("p"), Delivery: delivery}
	var r consumer.Result
	if mode == "batch" {
		r = c.ProcessBatch(ctx, []*consumer.Message{m, {ID: "other-" + strconv.Itoa(delivery), Payload: []byte("p")}})[0]
	} else {
		r = c.Process(ctx, m)
	}
	_ = json.NewEncoder(os.Stdout).Encode(childResult{Outcome: r.Outcome, Attempts: r.Attempts, Err: fmt.Sprint(r.Err)})
	return 0
}

type childResult struct {
	Outcome  consumer.Outcome
	Attempts int
	Err      string
}

// children numbers the child processes, to tell their connections apart.
var children atomic.Int64

// child is a running consumer process.
type child struct {
	cmd *exec.Cmd
	app string // the application_name of its connections
	out bytes.Buffer
}

func startChild(t *testing.T, mode, dsn string, delivery int, fail bool, env ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: exec.Command(exe, "-test.run=^$"), app: fmt.Sprintf("idemq-child-%d", children.Add(1))}
	ch.cmd.Env = append(os.Environ(), childEnv+"="+mode, childDSN+"="+dsn, childDelivery+"="+strconv.Itoa(delivery), childApp+"="+ch.app)
	if fail {
		ch.cmd.Env = append(ch.cmd.Env, childFail+"=1")
	}
	ch.cmd.Env = append(ch.cmd.Env, env...)
	ch.cmd.Stdout, ch.cmd.Stderr = &ch.out, os.Stderr
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.cmd.Process.Kill(); _ = ch.cmd.Wait() })
	return ch
}

// result waits for the child to exit and returns what it reported.
func (ch *child) result(t *testing.T) childResult {
	t.Helper()
	if err := ch.cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	var r childResult
	if err := json.Unmarshal(ch.out.Bytes(), &r); err != nil {
		t.Fatalf("child output %q: %v", ch.out.String(), err)
	}
	return r
}

// kill SIGKILLs the child and reaps it.
func (ch *child) kill(t *testing.T) {
	t.Helper()
	if err := ch.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = ch.cmd.Wait()
}

// waitingBackend waits until the child's connection waits on a lock and
// returns its backend pid.
func (ch *child) waitingBackend(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var pid int
	idemqtest.WaitFor(t, "a child connection waiting on the parent's lock", func() bool {
		err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock' AND datname = current_database()`, ch.app).Scan(&pid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return err == nil
	})
	return pid
}

// crashBundle is a database with the inbox, and the parent's transaction
// holding an uncommitted claim of crashKey, the row lock children wait on.
type crashBundle struct {
	pool   *pgxpool.Pool
	dsn    string
	parent *consumer.Consumer
	hold   pgx.Tx
}

func crashSetup(t *testing.T) *crashBundle {
	t.Helper()
	pool := setup(t)
	b := &crashBundle{pool: pool, dsn: pool.Config().ConnString(), parent: newConsumer(t, pool, insertOrder, crashConfig)}
	b.lock(t)
	return b
}

// lock makes the parent hold an uncommitted claim of crashKey.
func (b *crashBundle) lock(t *testing.T) {
	t.Helper()
	claims := (*inboxsql.Store)(b.parent.Store())
	tx, claim, err := claims.BeginClaim(context.Background(), "billing", crashKey, fingerprint("p"))
	if err != nil || !claim.New {
		t.Fatalf("parent claim: %+v, %v", claim, err)
	}
	b.hold = tx
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
}

// unlock rolls the parent's claim back: the key is free again.
func (b *crashBundle) unlock(t *testing.T) {
	t.Helper()
	if err := b.hold.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// killWhileWaiting starts a child for delivery, lets it wait on the
// parent's lock and SIGKILLs it there.
func (b *crashBundle) killWhileWaiting(t *testing.T, mode string, delivery int) {
	t.Helper()
	ch := startChild(t, mode, b.dsn, delivery, false)
	ch.waitingBackend(t, b.pool)
	ch.kill(t)
}

// terminateWhileWaiting starts a child for delivery, lets it wait on the
// parent's lock and terminates its connection from the server.
func (b *crashBundle) terminateWhileWaiting(t *testing.T, mode string, delivery int) childResult {
	t.Helper()
	ch := startChild(t, mode, b.dsn, delivery, false)
	pid := ch.waitingBackend(t, b.pool)
	if _, err := b.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	return ch.result(t)
}

// fingerprint is the consumer's default fingerprint of payload.
func fingerprint(payload string) []byte {
	sum := sha256.Sum256([]byte(payload))
	return sum[:]
}

// A consumer killed four times while waiting on a row lock, then cut off
// by pg_terminate_backend once, must not count any of that as a failed
// attempt: with Redeliver on and MaxAttempts 3, one real handler failure
// on the sixth delivery is attempt 1 of 3 (counting deliveries made it the
// sixth and dead-lettered the message), and the seventh applies the
// message exactly once.
func TestKilledConsumersNeverDeadLetterAMessage(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := crashSetup(t)
			ctx := context.Background()
			for delivery := 1; delivery <= 4; delivery++ {
				b.killWhileWaiting(t, mode, delivery)
			}
			if r := b.terminateWhileWaiting(t, mode, 5); r.Outcome != consumer.Retry || r.Attempts != 0 {
				t.Fatalf("terminated connection: %+v, want Retry with no attempt counted", r)
			}
			b.unlock(t)

			if r := startChild(t, mode, b.dsn, 6, true).result(t); r.Outcome != consumer.Retry || r.Attempts != 1 {
				t.Fatalf("sixth delivery, the handler fails: %+v, want Retry after attempt 1", r)
			}
			if r := startChild(t, mode, b.dsn, 7, false).result(t); r.Outcome != consumer.Applied || r.Attempts != 2 {
				t.Fatalf("seventh delivery: %+v, want Applied on attempt 2", r)
			}
			if n := count(t, b.pool, `SELECT count(*) FROM orders WHERE id = $1`, crashKey); n != 1 {
				t.Fatalf("the message was applied %d times, want once", n)
			}
			rec, err := b.parent.Store().Get(ctx, "billing", crashKey)
			if err != nil || rec.Status != inbox.Succeeded || rec.Failures != 1 {
				t.Fatalf("record %+v, %v; want SUCCEEDED after 1 failure", rec, err)
			}
			// Every later delivery is a duplicate, never ErrDeadLetter.
			if r := b.parent.Process(ctx, &consumer.Message{ID: crashKey, Payload: []byte("p"), Delivery: 8}); r.Outcome != consumer.Duplicate {
				t.Fatalf("eighth delivery: %+v, want Duplicate", r)
			}
		})
	}
}

// Killed deliveries leave the key with no counted attempt; one real
// handler failure counts one.
func TestAttemptsCountOnlyHandlerFailures(t *testing.T) {
	t.Parallel()
	b := crashSetup(t)
	ctx := context.Background()
	for delivery := 1; delivery <= 3; delivery++ {
		b.killWhileWaiting(t, "single", delivery)
	}
	b.unlock(t)
	if _, err := b.parent.Store().Get(ctx, "billing", crashKey); !errors.Is(err, inbox.ErrNotFound) {
		t.Fatalf("after killed deliveries the key has a record (%v); want no counted attempt", err)
	}

	if r := startChild(t, "single", b.dsn, 4, true).result(t); r.Outcome != consumer.Retry || r.Attempts != 1 {
		t.Fatalf("failing handler: %+v, want Retry after attempt 1", r)
	}
	rec, err := b.parent.Store().Get(ctx, "billing", crashKey)
	if err != nil || rec.Status != inbox.FailedRetryable || rec.Failures != 1 || rec.LastError != "the handler failed" {
		t.Fatalf("after one handler failure: %+v, %v; want FAILED_RETRYABLE with 1 failure", rec, err)
	}
	if r := startChild(t, "single", b.dsn, 5, false).result(t); r.Outcome != consumer.Applied || r.Attempts != 2 {
		t.Fatalf("next delivery: %+v, want Applied on attempt 2", r)
	}
	if n := orders(t, b.pool); n != 1 {
		t.Fatalf("%d business rows, want 1", n)
	}
}

// A consumer killed while its handler's statement waits on a lock leaves
// a backend that holds its uncommitted claim until that statement ends;
// the transaction's client_connection_check_interval ends it within
// seconds, so the next owner of the key proceeds while the lock the dead
// handler waited for is still held.
func TestOrphanedClaimOfAKilledConsumerIsReleased(t *testing.T) {
	// Not parallel: a crash test timed by the server's 2s client_connection_check_interval; parallel load makes it flaky.
	for _, mode := range []string{"single", "batch"} {
		t.Run(mode, func(t *testing.T) {
			pool := setup(t)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id int); INSERT INTO accounts VALUES (1)`); err != nil {
				t.Fatal(err)
			}
			next := newConsumer(t, pool, insertOrder, crashConfig)
			// A long transaction holds the row the child's handler needs.
			long, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer long.Rollback(ctx) //nolint:errcheck // the test's end
			if _, err := long.Exec(ctx, `SELECT 1 FROM accounts FOR UPDATE`); err != nil {
				t.Fatal(err)
			}

			ch := startChild(t, mode, pool.Config().ConnString(), 1, false, childStuck+"=1")
			ch.waitingBackend(t, pool)
			ch.kill(t)

			done := make(chan consumer.Result, 1)
			go func() { done <- next.Process(ctx, msg(crashKey, "p")) }()
			select {
			case r := <-done:
				if r.Outcome != consumer.Applied {
					t.Fatalf("next owner: %+v, want Applied", r)
				}
			case <-time.After(time.Minute):
				_ = long.Rollback(ctx)
				t.Fatalf("the next owner of the key still waits on the killed consumer's claim: %+v", <-done)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE id = $1`, crashKey); n != 1 {
				t.Fatalf("the message was applied %d times, want once", n)
			}
		})
	}
}
