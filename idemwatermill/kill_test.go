package idemwatermill_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/idemwatermill"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// The kill test runs a Watermill Router in a child process, the test binary
// started again with childEnv set, so that it can be SIGKILLed like a real
// service.
const (
	childEnv  = "IDEMQ_WATERMILL_CHILD" // the database URL
	childHang = "IDEMQ_WATERMILL_HANG"  // hang after this many applied messages, 0: never
	// appliedFlag is set in a message's metadata by the handler, so the
	// Router's outer middleware can tell an applied message from a
	// duplicate the Middleware acked without running it.
	appliedFlag = "x-test-applied"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(childEnv); dsn != "" {
		os.Exit(runChild(dsn))
	}
	os.Exit(m.Run())
}

// childOutbox is the outbox table of the kill test.
var childOutbox = outbox.Config{Table: "watermill_outbox"}

// runChild runs a Router whose handler records each message's payload as
// an effect through the Middleware's transaction. It prints "delivered
// UUID" for every delivery and "applied UUID" once a message's transaction
// committed, and after the hang-th applied message it stops right there,
// before the Ack, until it is killed.
func runChild(dsn string) int {
	ctx := context.Background()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 2 }
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fail(err)
	}
	ob, err := outbox.New(pool, childOutbox)
	if err != nil {
		return fail(err)
	}
	// A short lease: a killed child's partitions go to the next one soon.
	sub, err := idemwatermill.NewSubscriber(pool, ob, idemwatermill.SubscriberConfig{Relay: relay.Config{LeaseTTL: time.Second, Logger: quiet}})
	if err != nil {
		return fail(err)
	}
	mw, err := idemwatermill.NewMiddleware(pool, "effects", consumer.Config{Logger: quiet})
	if err != nil {
		return fail(err)
	}
	hang, _ := strconv.Atoi(os.Getenv(childHang))
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return fail(err)
	}
	applied := 0
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			fmt.Println("delivered", msg.UUID)
			out, err := h(msg)
			if err == nil && msg.Metadata.Get(appliedFlag) != "" {
				fmt.Println("applied", msg.UUID)
				if applied++; applied == hang {
					select {} // committed, never acked: the parent kills us here
				}
			}
			return out, err
		}
	}, mw.Wrap)
	router.AddConsumerHandler("effects", "effects", sub, func(msg *message.Message) error {
		tx, _ := idemwatermill.Tx(msg.Context())
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+idemqtest.EffectsTable+` (key) VALUES ($1)`, string(msg.Payload)); err != nil {
			return err
		}
		msg.Metadata.Set(appliedFlag, "1")
		return nil
	})
	if err := router.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// child is a running Router process and the lines it printed.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func startChild(t *testing.T, dsn string, hang int) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: exec.Command(exe, "-test.run=^$"), lines: make(chan string, 1000)}
	ch.cmd.Env = append(os.Environ(), childEnv+"="+dsn, childHang+"="+strconv.Itoa(hang))
	ch.cmd.Stderr = os.Stderr
	out, err := ch.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			ch.lines <- s.Text()
		}
		close(ch.lines)
	}()
	t.Cleanup(func() { _ = ch.cmd.Process.Kill(); _ = ch.cmd.Wait() })
	return ch
}

// waitApplied reads the child's lines until it applied n messages and
// returns the UUIDs it was delivered and the last one it applied.
func (ch *child) waitApplied(t *testing.T, n int) (delivered []string, last string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for applied := 0; applied < n; {
		select {
		case line, ok := <-ch.lines:
			if !ok {
				t.Fatalf("the child exited after %d of %d applied messages", applied, n)
			}
			what, id, _ := strings.Cut(line, " ")
			switch what {
			case "delivered":
				delivered = append(delivered, id)
			case "applied":
				applied++
				last = id
			}
		case <-timeout:
			t.Fatalf("the child applied %d of %d messages within a minute", applied, n)
		}
	}
	return delivered, last
}

// TestMiddlewareKilledRouterAppliesOnce: Router processes are SIGKILLed
// right after a message's transaction committed and before its Ack, three
// times. The relay hands that message (and the messages acked before it in
// the same relay batch, whose rows are deleted with the batch) to the next
// process, which acks them as duplicates without running the handler:
// every message is applied exactly once, in order.
func TestMiddlewareKilledRouterAppliesOnce(t *testing.T) {
	t.Parallel()
	const messages, perChild, kills = 40, 5, 3
	b := setup(t)
	ctx := context.Background()
	effects := idemqtest.NewEffects(t, b.pool)
	var want []string
	for i := range messages {
		want = append(want, fmt.Sprintf("m-%02d", i))
		if err := b.pub.Publish("effects", message.NewMessage(watermill.NewUUID(), []byte(want[i]))); err != nil {
			t.Fatal(err)
		}
	}
	dsn := b.pool.Config().ConnString()
	var hung string  // the message committed, not acked, by the last killed child
	redelivered := 0 // deliveries acked as duplicates
	for range kills {
		ch := startChild(t, dsn, perChild)
		delivered, last := ch.waitApplied(t, perChild)
		if hung != "" && !slices.Contains(delivered, hung) {
			t.Errorf("after a kill the next child was delivered %v, not %s, the message its predecessor committed and never acked", delivered, hung)
		}
		redelivered += len(delivered) - perChild
		hung = last
		if err := ch.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = ch.cmd.Wait()
	}
	startChild(t, dsn, 0)
	idemqtest.WaitFor(t, "every message applied and the outbox empty", func() bool {
		st, err := b.ob.Stats(ctx)
		return err == nil && st.Pending == 0 && effects.Total(t) >= messages
	}, idemqtest.Within(2*time.Minute))
	effects.AssertOnce(t, want...)
	if seq := effects.Load(t).Sequence(); !slices.Equal(seq, want) {
		t.Errorf("applied in the order %v, want %v", seq, want)
	}
	if redelivered < kills-1 {
		t.Errorf("%d redeliveries after %d kills: the kills did not fall between a commit and its Ack", redelivered, kills)
	}
}
