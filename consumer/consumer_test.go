package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/testenv"
)

// setup returns a pool on a fresh database with the inbox and a business
// table "orders" without any unique constraint, so every double
// application shows as an extra row.
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Postgres(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id text NOT NULL, payload text NOT NULL, tx bigint DEFAULT txid_current())`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// insertOrder is the business side effect of the tests.
func insertOrder(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO orders (id, payload) VALUES ($1, $2)`, msg.ID, string(msg.Payload))
	return err
}

func newConsumer(t testing.TB, pool *pgxpool.Pool, h consumer.Handler, cfg consumer.Config) *consumer.Consumer {
	t.Helper()
	if cfg.Retry.BaseDelay == 0 {
		cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = time.Millisecond, 5*time.Millisecond
	}
	c, err := consumer.New(pool, "billing", h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func orders(t testing.TB, pool *pgxpool.Pool) int {
	return count(t, pool, `SELECT count(*) FROM orders`)
}

func msg(id, payload string) *consumer.Message {
	return &consumer.Message{ID: id, Payload: []byte(payload)}
}

func TestOneMessageDeliveredOverAndOverIsAppliedOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, insertOrder, consumer.Config{})
	ctx := context.Background()
	outcomes := map[consumer.Outcome]int{}
	for range 1000 {
		outcomes[c.Process(ctx, msg("order-1", "pay 10")).Outcome]++
	}
	if outcomes[consumer.Applied] != 1 || outcomes[consumer.Duplicate] != 999 {
		t.Fatalf("outcomes of 1,000 deliveries: %v", outcomes)
	}

	var applied, duplicates atomic.Int32
	var wg sync.WaitGroup
	deliveries := make(chan struct{}, 50)
	for range 50 {
		deliveries <- struct{}{}
	}
	close(deliveries)
	for range 8 {
		wg.Go(func() {
			for range deliveries {
				switch r := c.Process(ctx, msg("order-2", "pay 20")); r.Outcome {
				case consumer.Applied:
					applied.Add(1)
				case consumer.Duplicate:
					duplicates.Add(1)
				default:
					t.Errorf("concurrent delivery: %v %v", r.Outcome, r.Err)
				}
			}
		})
	}
	wg.Wait()
	if applied.Load() != 1 || duplicates.Load() != 49 {
		t.Fatalf("50 concurrent deliveries: %d applied, %d duplicates", applied.Load(), duplicates.Load())
	}
	if n := orders(t, pool); n != 2 {
		t.Fatalf("%d business rows for 2 messages", n)
	}
}

// A failed handler must not mark the message as seen: its redelivery is
// applied (a deduplicator that records the key before the handler runs
// drops it instead).
func TestFailedHandlerIsRolledBackAndItsRetryAppliesOnce(t *testing.T) {
	t.Parallel()
	for _, redeliver := range []bool{false, true} {
		t.Run(fmt.Sprintf("redeliver=%v", redeliver), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			var calls atomic.Int32
			c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := insertOrder(ctx, tx, m); err != nil {
					return err
				}
				if calls.Add(1) == 1 {
					return errors.New("downstream hiccup after the business write")
				}
				return nil
			}, consumer.Config{Redeliver: redeliver})
			ctx := context.Background()
			r := c.Process(ctx, msg("order-1", "p"))
			if redeliver {
				if r.Outcome != consumer.Retry || r.RetryAfter <= 0 && r.Err == nil {
					t.Fatalf("first delivery = %+v, want Retry with the error", r)
				}
				if orders(t, pool) != 0 {
					t.Fatal("the failed attempt left a business row")
				}
				if rec, err := c.Store().Get(ctx, "billing", "order-1"); err != nil || rec.Status != inbox.FailedRetryable || rec.Failures != 1 {
					t.Fatalf("after the failed attempt the record is %+v, %v; want FAILED_RETRYABLE with 1 failure", rec, err)
				}
				r = c.Process(ctx, &consumer.Message{ID: "order-1", Payload: []byte("p"), Delivery: 2})
			}
			if r.Outcome != consumer.Applied || r.Attempts != 2 {
				t.Fatalf("result = %+v, want Applied on attempt 2", r)
			}
			if n := orders(t, pool); n != 1 {
				t.Fatalf("%d business rows, want 1", n)
			}
		})
	}
}

func TestSameKeyDifferentPayloadIsAConflict(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE dead_letters (id text, cause text)`); err != nil {
		t.Fatal(err)
	}
	c := newConsumer(t, pool, insertOrder, consumer.Config{
		DeadLetter: func(ctx context.Context, tx pgx.Tx, m *consumer.Message, cause error) error {
			_, err := tx.Exec(ctx, `INSERT INTO dead_letters VALUES ($1, $2)`, m.ID, cause.Error())
			return err
		},
	})
	ctx := context.Background()
	if r := c.Process(ctx, msg("order-1", "pay 10")); r.Outcome != consumer.Applied {
		t.Fatalf("first = %+v", r)
	}
	r := c.Process(ctx, msg("order-1", "pay 99"))
	var conflict *inbox.ConflictError
	if r.Outcome != consumer.Conflict || !errors.As(r.Err, &conflict) || !r.Settled() {
		t.Fatalf("reused key = %+v, want a settled Conflict with *inbox.ConflictError", r)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE payload = 'pay 99'`); n != 0 {
		t.Fatal("the conflicting payload was applied")
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letters WHERE id = 'order-1'`); n != 1 {
		t.Fatalf("the conflict reached the dead-letter hook %d times, want 1", n)
	}
}

func TestPoisonMessageIsDeadLetteredAndStaysDead(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE dead_letters (id text, cause text)`); err != nil {
		t.Fatal(err)
	}
	var calls, retries atomic.Int32
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.Add(1)
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "permanent" {
			return idemq.Permanent(errors.New("malformed order"))
		}
		panic("handler bug")
	}, consumer.Config{
		Retry: idemq.Retry{MaxAttempts: 3},
		DeadLetter: func(ctx context.Context, tx pgx.Tx, m *consumer.Message, cause error) error {
			_, err := tx.Exec(ctx, `INSERT INTO dead_letters VALUES ($1, $2)`, m.ID, cause.Error())
			return err
		},
		Hooks: consumer.Hooks{OnRetried: func(consumer.RetriedEvent) { retries.Add(1) }},
	})
	ctx := context.Background()

	r := c.Process(ctx, msg("panics", "p"))
	if r.Outcome != consumer.DeadLettered || r.Attempts != 3 || calls.Load() != 3 || retries.Load() != 2 {
		t.Fatalf("panicking handler: %+v after %d calls, %d retries; want dead-lettered after 3", r, calls.Load(), retries.Load())
	}
	r = c.Process(ctx, msg("permanent", "p"))
	if r.Outcome != consumer.DeadLettered || r.Attempts != 1 || calls.Load() != 4 {
		t.Fatalf("permanent error: %+v, want dead-lettered at once", r)
	}
	r = c.Process(ctx, msg("permanent", "p"))
	if r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrDeadLetter) || calls.Load() != 4 {
		t.Fatalf("redelivered dead letter: %+v; the handler must not run again", r)
	}
	if orders(t, pool) != 0 {
		t.Fatal("a failed handler's business write survived")
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letters`); n != 2 {
		t.Fatalf("%d dead letters, want 2", n)
	}
	rec, err := c.Store().Get(ctx, "billing", "panics")
	if err != nil || rec.Status != inbox.FailedFinal || !strings.Contains(rec.LastError, "handler bug") || rec.Failures != 3 {
		t.Fatalf("dead-letter record = %+v, %v", rec, err)
	}
}

func TestBadInputGetsAClearErrorAndWritesNothing(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, insertOrder, consumer.Config{Inbox: inbox.Config{MaxKeyLen: 64}})
	ctx := context.Background()
	for name, m := range map[string]*consumer.Message{
		"nil message":   nil,
		"empty key":     msg("", "p"),
		"key too long":  msg(strings.Repeat("k", 65), "p"),
		"invalid UTF-8": msg("\xff", "p"),
		"NUL in key":    msg("a\x00b", "p"),
		"nil payload":   {ID: "order-1"},
	} {
		r := c.Process(ctx, m)
		if r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrInvalidMessage) {
			t.Errorf("%s: %+v, want DeadLettered with ErrInvalidMessage", name, r)
		}
		if rs := c.ProcessBatch(ctx, []*consumer.Message{m}); !errors.Is(rs[0].Err, consumer.ErrInvalidMessage) {
			t.Errorf("%s in a batch: %+v", name, rs[0])
		}
	}

	panicky := newConsumer(t, pool, insertOrder, consumer.Config{KeyFunc: func(m *consumer.Message) (string, error) {
		return string(m.Payload[:3]), nil // panics on a short payload
	}})
	if r := panicky.Process(ctx, msg("id", "p")); r.Outcome != consumer.DeadLettered || !errors.Is(r.Err, consumer.ErrInvalidMessage) {
		t.Errorf("KeyFunc panicking: %+v, want DeadLettered with ErrInvalidMessage", r)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if r := c.Process(cancelled, msg("order-1", "p")); r.Outcome != consumer.Retry || !errors.Is(r.Err, context.Canceled) {
		t.Errorf("cancelled context: %+v, want Retry", r)
	}
	if orders(t, pool) != 0 || count(t, pool, `SELECT count(*) FROM idemq_inbox`) != 0 {
		t.Fatal("bad input left rows behind")
	}
}

// The handler's own connection is terminated mid-transaction: nothing
// is half-written, the lost connection is not counted as a failed attempt,
// and the redelivery applies the message once.
func TestDatabaseDroppingTheConnectionMidTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var killed atomic.Bool
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		if killed.CompareAndSwap(false, true) {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return nil
	}, consumer.Config{})
	ctx := context.Background()
	r := c.Process(ctx, msg("order-1", "p"))
	if r.Outcome != consumer.Retry || !r.Unavailable || r.Attempts != 0 || orders(t, pool) != 0 {
		t.Fatalf("dropped connection: %+v, want an Unavailable Retry with no attempt counted and nothing written", r)
	}
	if _, err := c.Store().Get(ctx, "billing", "order-1"); !errors.Is(err, inbox.ErrNotFound) {
		t.Fatalf("the dropped connection left an inbox record (a counted failure): %v", err)
	}
	if r := c.Process(ctx, msg("order-1", "p")); r.Outcome != consumer.Applied || r.Attempts != 1 {
		t.Fatalf("redelivery after a dropped connection: %+v, want Applied on its first counted attempt", r)
	}
	for _, m := range []*consumer.Message{msg("order-1", "p"), msg("order-1", "p")} {
		if r := c.Process(ctx, m); r.Outcome != consumer.Duplicate {
			t.Fatalf("redelivery: %+v", r)
		}
	}
	if n := orders(t, pool); n != 1 {
		t.Fatalf("%d business rows, want 1", n)
	}
}

func TestHandlerCannotEndTheTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}, consumer.Config{Retry: idemq.Retry{MaxAttempts: 1}})
	if r := c.Process(context.Background(), msg("order-1", "p")); r.Outcome != consumer.DeadLettered || !strings.Contains(r.Err.Error(), "must not commit") {
		t.Fatalf("handler committing: %+v", r)
	}
	if orders(t, pool) != 0 {
		t.Fatal("a handler's own commit went through")
	}
}

func TestBusinessKeyAndLogLinesCarryScopeAndKey(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	var results []consumer.Result
	c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Payload) == `{"order":"bad"}` {
			return errors.New("rejected")
		}
		return insertOrder(ctx, tx, m)
	}, consumer.Config{
		KeyFunc: func(m *consumer.Message) (string, error) {
			var body struct{ Order string }
			err := json.Unmarshal(m.Payload, &body)
			return "order:" + body.Order, err
		},
		Retry:  idemq.Retry{MaxAttempts: 2},
		Logger: slogJSON(&logs),
		Hooks: consumer.Hooks{OnResult: func(e consumer.ResultEvent) {
			mu.Lock()
			defer mu.Unlock()
			results = append(results, e.Result)
		}},
	})
	ctx := context.Background()
	// Two message ids, one business key: applied once.
	c.Process(ctx, msg("id-1", `{"order":"o-7"}`))
	c.Process(ctx, msg("id-2", `{"order":"o-7"}`))
	c.Process(ctx, msg("id-3", `{"order":"bad"}`))
	c.Process(ctx, msg("id-4", `not json`))
	if n := orders(t, pool); n != 1 {
		t.Fatalf("%d business rows for one business key", n)
	}
	want := []consumer.Outcome{consumer.Applied, consumer.Duplicate, consumer.DeadLettered, consumer.DeadLettered}
	for i, r := range results {
		if r.Outcome != want[i] {
			t.Fatalf("hook results %v, want outcomes %v", results, want)
		}
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) < 4 {
		t.Fatalf("only %d log lines:\n%s", len(lines), logs.String())
	}
	for _, line := range lines {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatal(err)
		}
		if entry["scope"] != "billing" || entry["key"] == nil {
			t.Fatalf("log line without scope and key: %s", line)
		}
	}
}

// A handler that keeps its transaction past its return cannot write with
// it: the write must not land outside the transaction, on a connection
// that went back to the pool.
func TestLeakedHandlerTxCannotWriteAfterCommit(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			var leaked pgx.Tx
			c := newConsumer(t, pool, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				leaked = tx
				return insertOrder(ctx, tx, m)
			}, consumer.Config{})
			ctx := context.Background()
			var r consumer.Result
			if batch {
				r = c.ProcessBatch(ctx, []*consumer.Message{msg("order-1", "p")})[0]
			} else {
				r = c.Process(ctx, msg("order-1", "p"))
			}
			if r.Outcome != consumer.Applied {
				t.Fatalf("result %+v", r)
			}
			if _, err := leaked.Exec(ctx, `INSERT INTO orders (id, payload) VALUES ('late', 'p')`); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("write through the leaked tx: %v, want ErrTxClosed", err)
			}
			if n := orders(t, pool); n != 1 {
				t.Fatalf("%d business rows, want 1", n)
			}
		})
	}
}

// refusing is a handler that inserts the order, and for the first times
// deliveries of message id has the database refuse its transaction with a
// serialization failure.
func refusing(id string, times int32) consumer.Handler {
	var refused atomic.Int32
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertOrder(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == id && refused.Add(1) <= times {
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return nil
	}
}

// A serialization failure or a deadlock is the database's, not the
// message's: the attempt is not counted and nothing is written, in
// per-message and batch mode, and the next delivery applies the message.
func TestDatabaseRefusingTheTransactionIsNotAFailedAttempt(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			c := newConsumer(t, pool, refusing("contended", 3), consumer.Config{Retry: idemq.Retry{MaxAttempts: 1}})
			ctx := context.Background()
			process := func(m *consumer.Message) consumer.Result {
				if batch {
					return c.ProcessBatch(ctx, []*consumer.Message{msg("other", "p"), m})[1]
				}
				return c.Process(ctx, m)
			}
			for range 3 {
				if r := process(msg("contended", "p")); r.Outcome != consumer.Retry || !r.Unavailable || r.Attempts != 0 {
					t.Fatalf("serialization failure: %+v, want an Unavailable Retry with no attempt counted", r)
				}
				if _, err := c.Store().Get(ctx, "billing", "contended"); !errors.Is(err, inbox.ErrNotFound) {
					t.Fatalf("the refused attempt left a record: %v", err)
				}
			}
			if r := process(msg("contended", "p")); r.Outcome != consumer.Applied || r.Attempts != 1 {
				t.Fatalf("next delivery: %+v, want Applied on attempt 1", r)
			}
			if n := count(t, pool, `SELECT count(*) FROM orders WHERE id = 'contended'`); n != 1 {
				t.Fatalf("applied %d times, want once", n)
			}
		})
	}
}

// A database that cannot be reached is told apart from the message's own
// failures and from a shutdown: Result.Unavailable is set, and the
// consumer logs it at Debug level (the transport reports the outage once);
// a cancelled context and a handler failure handed back in Redeliver mode
// are Retries without it, logged at Warn.
func TestUnreachableDatabaseIsUnavailable(t *testing.T) {
	t.Parallel()
	pool, proxy := testenv.PostgresBehindProxy(t)
	var logs testenv.Logs
	c := newConsumer(t, pool, func(context.Context, pgx.Tx, *consumer.Message) error { return errors.New("refused") },
		consumer.Config{Redeliver: true, Logger: logs.Logger()})
	ctx := context.Background()

	if r := c.Process(ctx, msg("fails", "p")); r.Outcome != consumer.Retry || r.Unavailable || r.Attempts != 1 {
		t.Fatalf("handler failure in Redeliver mode: %+v, want a Retry that is not Unavailable", r)
	}
	proxy.Cut()
	if r := c.Process(ctx, msg("down", "p")); r.Outcome != consumer.Retry || !r.Unavailable || r.Attempts != 0 {
		t.Fatalf("database down: %+v, want an Unavailable Retry, no attempt counted", r)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if r := c.Process(cancelled, msg("down", "p")); r.Outcome != consumer.Retry || r.Unavailable {
		t.Fatalf("cancelled context: %+v, want a Retry that is not Unavailable", r)
	}
	warn := 0
	for _, rec := range logs.Records("message retry") {
		if rec.Level >= slog.LevelWarn {
			warn++
			if rec.Attrs["key"] == "down" && !strings.Contains(rec.Attrs["error"], "context canceled") {
				t.Fatalf("the outage was logged at %v: %+v", rec.Level, rec)
			}
		}
	}
	if warn != 2 {
		t.Fatalf("%d Warn lines for retries, want 2 (the handler failure and the cancelled context): %+v", warn, logs.Records("message retry"))
	}
}

// In a batch, a message the database refused holds back the new messages
// behind it: none is applied before it, whatever its key.
func TestBatchHoldsTheMessagesBehindADatabaseError(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool, refusing("first", 1), consumer.Config{})
	ctx := context.Background()
	batch := func() []*consumer.Message {
		return []*consumer.Message{msg("before", "p"), msg("first", "p"), msg("second", "p"), msg("third", "p")}
	}
	results := c.ProcessBatch(ctx, batch())
	for i, want := range []bool{false, true, true, true} {
		if r := results[i]; (r.Outcome == consumer.Retry) != want || r.Unavailable != want {
			t.Fatalf("result %d: %+v; want Retry and Unavailable %v", i, r, want)
		}
	}
	if n := orders(t, pool); n != 1 {
		t.Fatalf("%d orders after the refused batch, want only the one before the refusal", n)
	}
	results = c.ProcessBatch(ctx, batch())
	for i, want := range []consumer.Outcome{consumer.Duplicate, consumer.Applied, consumer.Applied, consumer.Applied} {
		if results[i].Outcome != want {
			t.Fatalf("redelivery: result %d %+v, want %v", i, results[i], want)
		}
	}
	var seq []string
	rows, err := pool.Query(ctx, `SELECT id FROM orders ORDER BY tx, ctid`)
	if err != nil {
		t.Fatal(err)
	}
	if seq, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(seq, " ") != "before first second third" {
		t.Fatalf("orders %v", seq)
	}
}
