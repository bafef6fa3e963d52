package transporttest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/inbox"
)

// KillPoint says where [KillChildren] kills a subscriber child process.
type KillPoint string

const (
	// KillInHandler kills the child inside the handler: the transaction
	// that claimed the message and wrote its effect is open, nothing is
	// committed. The delivery was no handler failure and must never count
	// toward a dead letter.
	KillInHandler KillPoint = "in-handler"
	// KillBeforeAck kills the child after the transaction committed and
	// before the acknowledgement (offset commit): the redelivery must be a
	// Duplicate.
	KillBeforeAck KillPoint = "before-ack"
)

// ChildScope is the consumer scope of [ChildConsumer].
const ChildScope = "orders"

const (
	childEnv   = "IDEMQ_TRANSPORTTEST_CHILD"
	killMarker = "idemq-transporttest: kill me now"
)

// ChildSpec is what a subscriber child process is told through its
// environment.
type ChildSpec struct {
	// DatabaseURL is the database with the effects table ([CreateEffects]).
	DatabaseURL string
	// Kill is where the child announces itself and waits to be killed.
	Kill KillPoint
	// Batch runs the transport's batch mode.
	Batch bool
	// Redeliver sets consumer.Config.Redeliver, so the transport's delivery
	// count reaches the consumer.
	Redeliver bool
	// Params carries the transport's own settings (brokers, stream, group).
	Params map[string]string
}

// Child returns the spec when the test binary runs as a subscriber child
// process of [KillChildren]; ok is false in a normal test run.
func Child() (spec ChildSpec, ok bool) {
	v := os.Getenv(childEnv)
	if v == "" {
		return spec, false
	}
	if err := json.Unmarshal([]byte(v), &spec); err != nil {
		panic(fmt.Sprintf("transporttest: %s: %v", childEnv, err))
	}
	return spec, true
}

// CreateEffects creates the effects table of [ChildConsumer]'s handler:
// one row per application and no unique constraint, so a double apply
// shows as two rows.
func CreateEffects(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	idemqtest.NewEffects(t, pool)
}

// ChildConsumer returns a migrated consumer of [ChildScope] on pool whose
// handler inserts one effects row per application; with [KillInHandler]
// it then announces itself and blocks, inside its transaction, until the
// process is killed. Retry.MaxAttempts is 2: a few kills must not add up
// to a dead letter.
func ChildConsumer(t *testing.T, pool *pgxpool.Pool, spec ChildSpec, hooks consumer.Hooks) *consumer.Consumer {
	t.Helper()
	effects := idemqtest.NewEffects(t, pool) // the parent's table
	c, err := consumer.New(pool, ChildScope, func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if err := effects.Record(ctx, tx, msg.ID); err != nil {
			return err
		}
		if spec.Kill == KillInHandler {
			awaitKill()
		}
		return nil
	}, consumer.Config{
		Redeliver: spec.Redeliver,
		Retry:     idemq.Retry{MaxAttempts: 2, BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Hooks:     hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// BeforeAck returns the crash point to set as the subscriber's
// Test.BeforeCommit or Test.BeforeAck: with [KillBeforeAck] it announces
// the child and blocks until the process is killed; otherwise nil.
func (spec ChildSpec) BeforeAck() func(context.Context, []*consumer.Message, []consumer.Result) error {
	if spec.Kill != KillBeforeAck {
		return nil
	}
	return func(context.Context, []*consumer.Message, []consumer.Result) error {
		awaitKill()
		return nil
	}
}

func awaitKill() {
	fmt.Println(killMarker)
	select {}
}

// KillChildren runs the test named test of this test binary as a
// subscriber child process once per kill point, each with spec and that
// kill point, and SIGKILLs it as soon as it announces that it reached the
// point. A child that exits on its own, or does not reach its point within
// a deadlock guard, fails t.
func KillChildren(t *testing.T, test string, spec ChildSpec, kills ...KillPoint) {
	t.Helper()
	for round, kill := range kills {
		spec.Kill = kill
		env, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+string(env))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		announced := make(chan bool, 1)
		go func() {
			lines := bufio.NewScanner(out)
			for lines.Scan() {
				if lines.Text() == killMarker {
					announced <- true
					return
				}
				t.Logf("child %d: %s", round, lines.Text())
			}
			announced <- false
		}()
		select {
		case ok := <-announced:
			if !ok {
				err := cmd.Wait()
				t.Fatalf("transporttest: child %d (%s) ended before its kill point: %v", round, kill, err)
			}
		case <-time.After(waitTimeout):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("transporttest: child %d never reached its kill point %s", round, kill)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait() // killed: the error says so
		t.Logf("child %d killed %s", round, kill)
	}
}

// AppliedOnceNeverDead checks, after every message was consumed, that
// each id in ids produced exactly one effects row, that nothing else did,
// and that the inbox of [ChildScope] holds each as applied: none was
// dead-lettered.
func AppliedOnceNeverDead(t *testing.T, pool *pgxpool.Pool, ids []string) {
	t.Helper()
	ctx := context.Background()
	idemqtest.NewEffects(t, pool).AssertOnce(t, ids...)
	store, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		rec, err := store.Get(ctx, ChildScope, id)
		if err != nil {
			t.Errorf("inbox record of %s: %v", id, err)
		} else if rec.Status != inbox.Succeeded {
			t.Errorf("message %s is %v in the inbox (failures %d), want %v", id, rec.Status, rec.Failures, inbox.Succeeded)
		}
	}
}

// Survive runs, in this process, the subscriber newSubscriber builds
// around a [ChildConsumer] of spec (without a kill point) until every id
// in ids settled, stops it, and checks [AppliedOnceNeverDead] and that the
// survivor saw a duplicate: the kills before the ack left committed work
// to redeliver.
func Survive(t *testing.T, pool *pgxpool.Pool, spec ChildSpec, ids []string, newSubscriber func(*consumer.Consumer) (idemq.Service, error)) {
	t.Helper()
	spec.Kill = ""
	var mu sync.Mutex
	settled := map[string]bool{}
	duplicates := 0
	all := make(chan struct{})
	c := ChildConsumer(t, pool, spec, consumer.Hooks{OnResult: func(r consumer.ResultEvent) {
		mu.Lock()
		defer mu.Unlock()
		if r.Outcome == consumer.Duplicate {
			duplicates++
		}
		if r.Settled() && !settled[r.Key] {
			if settled[r.Key] = true; len(settled) == len(ids) {
				close(all)
			}
		}
	}})
	s, err := newSubscriber(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	running, err := idemq.Start(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("transporttest: the survivor did not settle every message")
	}
	if err := running.Stop(); err != nil {
		t.Fatal(err)
	}
	AppliedOnceNeverDead(t, pool, ids)
	mu.Lock()
	defer mu.Unlock()
	if duplicates == 0 {
		t.Error("the survivor saw no duplicate: the kills before the ack left nothing to redeliver")
	}
}
