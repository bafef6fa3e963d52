package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
)

// The linearizability check of the inbox's claim: many goroutines deliver
// a few keys at once, each many times, now and then with another payload,
// and the handler fails now and then (Redeliver mode, so a failure is a
// Retry and the third one a dead letter). Every key's history of results
// must be explained by one sequential inbox record, the model below: at
// most one Applied per key, ever.

// delivery is one call of Process: the key and the payload's fingerprint
// ("A" or "B").
type delivery struct{ key, fp string }

// inboxRecord is one key's record as the model sees it: the fingerprint it
// was first recorded with ("" while there is no record), and whether it
// was applied or dead-lettered.
type inboxRecord struct {
	fp            string
	applied, dead bool
}

// inboxModel is the sequential specification of one key in the inbox.
var inboxModel = porcupine.NondeterministicModel{
	Init: func() []any { return []any{inboxRecord{}} },
	Step: func(st, input, output any) []any {
		s, in, r := st.(inboxRecord), input.(delivery), output.(consumer.Result)
		same := s.fp == "" || s.fp == in.fp
		open := same && !s.applied && !s.dead
		switch r.Outcome {
		case consumer.Applied:
			if open {
				return []any{inboxRecord{fp: in.fp, applied: true}}
			}
		case consumer.Duplicate:
			if s.applied && s.fp == in.fp {
				return []any{s}
			}
		case consumer.Conflict:
			if !same {
				return []any{s}
			}
		case consumer.DeadLettered:
			if open || (s.dead && s.fp == in.fp) {
				return []any{inboxRecord{fp: in.fp, dead: true}}
			}
		case consumer.Retry, 0:
			next := []any{s}
			if s.fp == "" { // a failed attempt, counted in a new record
				next = append(next, inboxRecord{fp: in.fp})
			}
			if unknown(r) && open { // a commit whose outcome was lost
				next = append(next, inboxRecord{fp: in.fp, applied: true}, inboxRecord{fp: in.fp, dead: true})
			}
			return next
		}
		return nil
	},
	Equal: func(a, b any) bool { return a.(inboxRecord) == b.(inboxRecord) },
	DescribeOperation: func(input, output any) string {
		in, r := input.(delivery), output.(consumer.Result)
		if r.Outcome == 0 {
			return "Process(" + in.fp + ") → killed"
		}
		desc := "Process(" + in.fp + ") → " + r.Outcome.String()
		if r.Unavailable {
			desc += " (unavailable)"
		}
		return desc
	},
	DescribeState: func(st any) string {
		s := st.(inboxRecord)
		return fmt.Sprintf("fp %q applied %v dead %v", s.fp, s.applied, s.dead)
	},
}

// processor is what the clients call: Consumer.Process, or a broken
// stand-in.
type processor func(ctx context.Context, m *consumer.Message) consumer.Result

// observer sees each delivery twice: when it is called (r nil) and when
// it returned.
type observer func(client int, in delivery, call int64, r *consumer.Result, ret int64)

// deliver delivers keys from clients goroutines through process until
// until. A new set of keys every 300 ms, the same in every process, makes
// many short histories.
func deliver(process processor, clients, keys int, prefix string, until time.Time, observe observer) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for time.Now().Before(until) {
				round := time.Now().UnixNano() / int64(300*time.Millisecond)
				in := delivery{key: fmt.Sprintf("%s%d-%d", prefix, round, rand.IntN(keys)), fp: "A"}
				if rand.IntN(10) == 0 {
					in.fp = "B"
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				call := time.Now().UnixNano()
				observe(c, in, call, nil, 0)
				r := process(ctx, &consumer.Message{ID: in.key, Payload: []byte(in.fp)})
				observe(c, in, call, &r, time.Now().UnixNano())
				cancel()
			}
		})
	}
	wg.Wait()
}

// operation is a delivery as porcupine sees it. One whose outcome is
// unknown (an Unavailable Retry, or r nil: its process was killed) may
// take effect at any time after its call.
func operation(client int, in delivery, call int64, r *consumer.Result, ret int64) porcupine.Operation {
	if r == nil {
		r = &consumer.Result{}
	}
	if unknown(*r) {
		ret = math.MaxInt64
	}
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: *r, Return: ret}
}

// unknown reports a result whose commit may or may not have happened; the
// zero Result stands for a call its process did not live to return from.
func unknown(r consumer.Result) bool {
	return r.Outcome == 0 || r.Outcome == consumer.Retry && r.Unavailable
}

// inboxHistory delivers keys from clients goroutines for d through process
// and returns the history.
func inboxHistory(process processor, clients, keys int, d time.Duration) []porcupine.Operation {
	var (
		mu  sync.Mutex
		ops []porcupine.Operation
	)
	deliver(process, clients, keys, fmt.Sprintf("lin-%d-", time.Now().UnixNano()), time.Now().Add(d),
		func(c int, in delivery, call int64, r *consumer.Result, ret int64) {
			if r != nil {
				mu.Lock()
				ops = append(ops, operation(c, in, call, r, ret))
				mu.Unlock()
			}
		})
	return ops
}

// checkInbox checks every key's history against the model and returns the
// keys whose history is not linearizable, each written as porcupine's
// HTML visualization into dir (if "", a new directory that outlives the
// test), and the count of Applied results per key.
func checkInbox(t *testing.T, ops []porcupine.Operation, dir string) (illegal []string, applied map[string]int) {
	t.Helper()
	model := inboxModel.ToModel()
	parts := map[string][]porcupine.Operation{}
	applied = map[string]int{}
	for _, op := range ops {
		key := op.Input.(delivery).key
		parts[key] = append(parts[key], op)
		if op.Output.(consumer.Result).Outcome == consumer.Applied {
			applied[key]++
		}
	}
	for key, ops := range parts {
		res, info := porcupine.CheckOperationsVerbose(model, ops, time.Minute)
		switch res {
		case porcupine.Illegal:
			if dir == "" {
				var err error
				if dir, err = os.MkdirTemp("", "idemq-inbox-linearizability-"); err != nil {
					t.Fatal(err)
				}
			}
			path := filepath.Join(dir, "inbox-"+key+".html")
			if err := porcupine.VisualizePath(model, info, path); err != nil {
				t.Errorf("visualizing key %s: %v", key, err)
			}
			illegal = append(illegal, fmt.Sprintf("%s (%d operations; see %s)", key, len(ops), path))
		case porcupine.Unknown:
			t.Logf("key %s: the check of %d operations timed out", key, len(ops))
		}
	}
	t.Logf("%d deliveries of %d keys checked", len(ops), len(parts))
	return illegal, applied
}

// inboxConfig hands a failed attempt back (Redeliver) so that failures
// and dead letters show in the history.
var inboxConfig = consumer.Config{Logger: slog.New(slog.DiscardHandler), Redeliver: true, Retry: idemq.Retry{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}

// flaky fails one attempt in four.
func flaky() error {
	if rand.IntN(4) == 0 {
		return errors.New("flaky handler")
	}
	return nil
}

// flakyOrder inserts the order and fails one attempt in four.
func flakyOrder(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if err := insertOrder(ctx, tx, m); err != nil {
		return err
	}
	return flaky()
}

// effects counts the business rows per key.
func effects(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, id := range ids {
		n[id]++
	}
	return n
}

// TestLinearizableInbox drives a transactional and a leased consumer on a
// real Postgres from many goroutines delivering the same keys; every
// key's history must be linearizable, and the effects must be exactly the
// Applied results: one business row (or leased effect) per Applied.
func TestLinearizableInbox(t *testing.T) {
	const clients, keys = 8, 3
	d := 2 * time.Second
	t.Run("transactional", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		c := newConsumer(t, pool, flakyOrder, inboxConfig)
		illegal, applied := checkInbox(t, inboxHistory(c.Process, clients, keys, d), "")
		if len(illegal) > 0 {
			t.Fatalf("not linearizable: %v", illegal)
		}
		compareEffects(t, applied, effects(t, pool))
	})
	t.Run("leased", func(t *testing.T) {
		t.Parallel()
		pool := setup(t)
		var mu sync.Mutex
		done := map[string]int{}
		c, err := consumer.NewLeased(pool, "mailer", func(ctx context.Context, m *consumer.Message, _ idemq.Lease) error {
			if err := flaky(); err != nil {
				return err
			}
			mu.Lock()
			done[m.ID]++
			mu.Unlock()
			return nil
		}, inboxConfig)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		illegal, applied := checkInbox(t, inboxHistory(c.Process, clients, keys, d), "")
		if len(illegal) > 0 {
			t.Fatalf("not linearizable: %v", illegal)
		}
		compareEffects(t, applied, done)
	})
}

// compareEffects fails unless the effects counted per key are the
// Applied results counted per key.
func compareEffects(t *testing.T, applied, effects map[string]int) {
	t.Helper()
	for key, n := range effects {
		if n != applied[key] {
			t.Errorf("key %s: the effect happened %d times, %d Applied results", key, n, applied[key])
		}
		delete(applied, key)
	}
	for key, n := range applied {
		t.Errorf("key %s: %d Applied results, no effect", key, n)
	}
}

// TestLinearizableInboxCatchesDoubleApply: the check finds a consumer out
// that reports a duplicate as applied, so a pass of the real one means
// something.
func TestLinearizableInboxCatchesDoubleApply(t *testing.T) {
	t.Parallel()
	c := newConsumer(t, setup(t), insertOrder, consumer.Config{Logger: inboxConfig.Logger})
	double := func(ctx context.Context, m *consumer.Message) consumer.Result {
		r := c.Process(ctx, m)
		if r.Outcome == consumer.Duplicate {
			r.Outcome = consumer.Applied
		}
		return r
	}
	if illegal, _ := checkInbox(t, inboxHistory(double, 4, 2, time.Second), t.TempDir()); len(illegal) == 0 {
		t.Fatal("a consumer that reports duplicates as applied passed the check")
	}
}

// The environment of a child of TestLinearizableInboxKilled.
const (
	linearPrefixEnv = "IDEMQ_CONSUMER_CHILD_PREFIX" // of the keys
	linearUntilEnv  = "IDEMQ_CONSUMER_CHILD_UNTIL"  // Unix ns: when to stop
	linearClients   = 4                             // goroutines per child
)

// linearLine is a line a child writes for each call and return of
// Process; Ret is 0 on a call's line.
type linearLine struct {
	Client      int
	Key, FP     string
	Call, Ret   int64
	Outcome     consumer.Outcome
	Unavailable bool
}

// linearChild is a consumer process of TestLinearizableInboxKilled: it
// delivers keys like inboxHistory's clients, writing a line to stdout at
// each call and return, until it is killed or its time is up.
func linearChild(pool *pgxpool.Pool) int {
	c, err := consumer.New(pool, "billing", flakyOrder, inboxConfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	incarnation, _ := strconv.Atoi(os.Getenv(childDelivery))
	until, _ := strconv.ParseInt(os.Getenv(linearUntilEnv), 10, 64)
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	deliver(c.Process, linearClients, 3, os.Getenv(linearPrefixEnv), time.Unix(0, until),
		func(client int, in delivery, call int64, r *consumer.Result, ret int64) {
			line := linearLine{Client: incarnation*linearClients + client, Key: in.key, FP: in.fp, Call: call, Ret: ret}
			if r != nil {
				line.Outcome, line.Unavailable = r.Outcome, r.Unavailable
			}
			mu.Lock()
			defer mu.Unlock()
			_ = enc.Encode(line)
		})
	return 0
}

// TestLinearizableInboxKilled: consumer processes (this binary
// re-executed) deliver the same keys while one of them is SIGKILLed every
// few hundred milliseconds and started again; the calls they did not
// live to return from may or may not have taken effect. Every key's
// history must be linearizable, and each key has at most one business
// row, there whenever a delivery reported it Applied.
func TestLinearizableInboxKilled(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	newConsumer(t, pool, insertOrder, inboxConfig) // migrates
	const procs = 3
	prefix := fmt.Sprintf("lin-%d-", time.Now().UnixNano())
	until := time.Now().Add(3 * time.Second)
	env := []string{linearPrefixEnv + "=" + prefix, linearUntilEnv + "=" + strconv.FormatInt(until.UnixNano(), 10)}
	var all []*child
	running := make([]*child, procs)
	start := func(i int) {
		running[i] = startChild(t, "linear", pool.Config().ConnString(), len(all), false, env...)
		all = append(all, running[i])
	}
	for i := range procs {
		start(i)
	}
	kills := 0
	for time.Now().Before(until) {
		time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
		i := rand.IntN(procs)
		running[i].kill(t)
		kills++
		start(i)
	}
	var ops []porcupine.Operation
	cut := 0
	for _, ch := range running {
		ch.kill(t)
	}
	for _, ch := range all {
		calls := map[[2]int64]linearLine{}
		dec := json.NewDecoder(&ch.out)
		for {
			var l linearLine
			if err := dec.Decode(&l); errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break // a line cut by the kill is a call never returned from
			} else if err != nil {
				t.Fatalf("a child's line: %v", err)
			}
			calls[[2]int64{int64(l.Client), l.Call}] = l
		}
		for _, l := range calls {
			var r *consumer.Result
			if l.Ret != 0 {
				r = &consumer.Result{Outcome: l.Outcome, Unavailable: l.Unavailable}
			} else {
				cut++
			}
			ops = append(ops, operation(l.Client, delivery{key: l.Key, fp: l.FP}, l.Call, r, l.Ret))
		}
	}
	t.Logf("%d processes, %d SIGKILLed, %d calls cut by a kill", len(all), kills, cut)
	illegal, applied := checkInbox(t, ops, "")
	if len(illegal) > 0 {
		t.Fatalf("not linearizable: %v", illegal)
	}
	for key, n := range effects(t, pool) {
		if n > 1 || n < applied[key] {
			t.Errorf("key %s: %d business rows, %d Applied results", key, n, applied[key])
		}
	}
}
