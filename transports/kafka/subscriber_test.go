package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/idemq/idemq/transports/transporttest"
	"github.com/segmentio/kafka-go"
)

// seen collects what the handler saw and every outcome.
type seen struct {
	mu       sync.Mutex
	msgs     map[string]kafka.Message // by consumer message id
	headers  map[string]map[string]string
	outcomes map[consumer.Outcome]int
	errs     []error
	effects  *idemqtest.Effects
}

func newSeen() *seen {
	return &seen{msgs: map[string]kafka.Message{}, headers: map[string]map[string]string{}, outcomes: map[consumer.Outcome]int{}}
}

func (s *seen) handler(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
	rec, ok := idemqkafka.Source(msg)
	if !ok {
		return idemq.Permanent(errors.New("no kafka record"))
	}
	s.mu.Lock()
	s.msgs[msg.ID] = rec
	s.headers[msg.ID] = msg.Headers
	s.mu.Unlock()
	return s.effects.Record(ctx, tx, msg.ID)
}

func (s *seen) onResult(r consumer.ResultEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcomes[r.Outcome]++
	if r.Err != nil {
		s.errs = append(s.errs, r.Err)
	}
}

func (s *seen) count(o consumer.Outcome) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outcomes[o]
}

type setup struct {
	pool *pgxpool.Pool
	k    *testenv.KafkaCluster
	c    *consumer.Consumer
	seen *seen
	ctx  context.Context
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	k := testenv.Kafka(t, 2, "orders", "orders.dlq")
	pool := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	s := newSeen()
	s.effects = idemqtest.NewEffects(t, pool)
	c, err := consumer.New(pool, "orders", s.handler, consumer.Config{
		Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond},
		Hooks: consumer.Hooks{OnResult: s.onResult},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &setup{pool: pool, k: k, c: c, seen: s, ctx: ctx}
}

func (st *setup) subscriber(t *testing.T, mutate func(*idemqkafka.SubscriberConfig)) *idemq.Running {
	t.Helper()
	cfg := subscriberConfig(st.k, st.k.Group("g"))
	cfg.DeadLetterTopic = st.k.Topic("orders.dlq")
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := idemqkafka.NewSubscriber(st.c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	running, err := idemq.Start(st.ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Stop() })
	return running
}

func (st *setup) produce(t *testing.T, msgs ...kafka.Message) {
	t.Helper()
	for i := range msgs {
		msgs[i].Topic = st.k.Topic("orders")
	}
	if err := st.k.Produce(st.ctx, msgs...); err != nil {
		t.Fatal(err)
	}
}

func idHeader(id string) []kafka.Header {
	return []kafka.Header{{Key: idemqkafka.IDHeaderDefault, Value: []byte(id)}}
}

func TestSubscriberHandsRecordAndHeadersToHandler(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	st.produce(t,
		kafka.Message{Key: []byte("order-1"), Value: []byte("a"), Headers: append(idHeader("id-a"), kafka.Header{Key: "traceparent", Value: []byte("00-1-2-01")})},
		kafka.Message{Key: []byte("order-2"), Value: []byte("b")}, // no id header
	)
	st.subscriber(t, nil)
	idemqtest.WaitFor(t, "two messages applied", func() bool { return st.seen.count(consumer.Applied) == 2 })

	st.seen.mu.Lock()
	defer st.seen.mu.Unlock()
	a, ok := st.seen.msgs["id-a"]
	if !ok {
		t.Fatalf("message with id header not seen under its id; saw %v", st.seen.msgs)
	}
	if string(a.Key) != "order-1" || a.Topic != st.k.Topic("orders") || string(a.Value) != "a" {
		t.Errorf("record %+v", a)
	}
	if st.seen.headers["id-a"]["traceparent"] != "00-1-2-01" {
		t.Errorf("headers %v", st.seen.headers["id-a"])
	}
	for id, m := range st.seen.msgs {
		if id == "id-a" {
			continue
		}
		if id != idemqkafka.FallbackID(m) || !strings.HasPrefix(id, st.k.Topic("orders")+"/") {
			t.Errorf("message without id header got id %q, want %q", id, idemqkafka.FallbackID(m))
		}
	}
}

func TestSubscriberBadInputNeverStallsThePartition(t *testing.T) {
	t.Parallel()
	for _, fallback := range []bool{false, true} {
		name := "DeadLetter"
		if fallback {
			name = "FallbackOnInvalidID"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := newSetup(t)
			key := []byte("one-partition")
			bad := []kafka.Message{
				{Key: key, Value: []byte("empty id"), Headers: idHeader("")},
				{Key: key, Value: []byte("long id"), Headers: idHeader(strings.Repeat("x", 5000))},
				{Key: key, Value: []byte("bad utf8"), Headers: idHeader("\xff\xfe")},
			}
			tombstone := kafka.Message{Key: key, Value: nil, Headers: idHeader("tombstone")}
			good := kafka.Message{Key: key, Value: []byte("good"), Headers: idHeader("good")}
			st.produce(t, append(bad, tombstone, good)...)
			st.subscriber(t, func(c *idemqkafka.SubscriberConfig) { c.FallbackOnInvalidID = fallback })

			wantApplied := 2 // the tombstone and the good one
			if fallback {
				wantApplied += len(bad)
			}
			idemqtest.WaitFor(t, "the good message applied", func() bool { return st.seen.count(consumer.Applied) == wantApplied })
			wantDead := len(bad) - (wantApplied - 2)
			idemqtest.WaitFor(t, "the bad ones dead-lettered", func() bool { return st.seen.count(consumer.DeadLettered) == wantDead })
			st.seen.mu.Lock()
			for _, err := range st.seen.errs {
				if !errors.Is(err, consumer.ErrInvalidMessage) {
					t.Errorf("dead letter error %v, want ErrInvalidMessage", err)
				}
			}
			st.seen.mu.Unlock()
			idemqtest.WaitFor(t, "the dead letters on the dead-letter topic", func() bool {
				msgs, err := st.k.ReadAll(st.ctx, st.k.Topic("orders.dlq"))
				if err != nil {
					t.Fatal(err)
				}
				if len(msgs) < wantDead {
					return false
				}
				for _, m := range msgs {
					if r, _ := header(m, consumer.HeaderDeadLetterReason); !strings.Contains(r, "invalid message") {
						t.Errorf("dead letter reason %q", r)
					}
					if src, _ := header(m, consumer.HeaderDeadLetterSource); !strings.HasPrefix(src, st.k.Topic("orders")+"/") {
						t.Errorf("dead letter source %q", src)
					}
				}
				return true
			})
		})
	}
}

func TestSubscriberGracefulShutdownCommits(t *testing.T) {
	// Not parallel: it counts the process's goroutines, which parallel tests change.
	st := newSetup(t)
	before := runtime.NumGoroutine()
	var msgs []kafka.Message
	for i := range 50 {
		id := string(rune('a'+i%26)) + string(rune('a'+i/26))
		msgs = append(msgs, kafka.Message{Key: []byte(id), Value: []byte(id), Headers: idHeader(id)})
	}
	st.produce(t, msgs...)
	for _, batch := range []bool{true, false} {
		sub := st.subscriber(t, func(c *idemqkafka.SubscriberConfig) { c.Batch = batch })
		idemqtest.WaitFor(t, "every message settled", func() bool {
			return st.seen.count(consumer.Applied)+st.seen.count(consumer.Duplicate) >= len(msgs)
		})
		if err := sub.Stop(); err != nil {
			t.Fatalf("Stop: %v", err)
		}
	}
	// The second run resumed from committed offsets: nothing was delivered
	// twice.
	if d := st.seen.count(consumer.Duplicate); d != 0 {
		t.Errorf("%d duplicates after a graceful restart, want 0 (offsets not committed on shutdown)", d)
	}
	// No goroutine outlives Run beyond kafka-go's shared transport pool,
	// which idles out: allow a little slack, wait for it.
	idemqtest.WaitFor(t, fmt.Sprintf("the goroutines of Run to end (%d before)", before), func() bool {
		return runtime.NumGoroutine() <= before
	}, idemqtest.Within(10*time.Second), idemqtest.Explain(func() string {
		buf := make([]byte, 1<<20)
		return fmt.Sprintf("%d goroutines:\n%s", runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}))
}

func TestSubscriberRecoversWhenTheBrokerReturns(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	if st.k.External() {
		t.Skip("stopping the broker needs the in-process one; " + testenv.KafkaBrokersEnv + " is set")
	}
	st.produce(t, kafka.Message{Key: []byte("k"), Value: []byte("1"), Headers: idHeader("1")})
	st.subscriber(t, nil)
	idemqtest.WaitFor(t, "the first message applied", func() bool { return st.seen.count(consumer.Applied) == 1 })
	if err := st.k.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // let the subscriber notice; not an assertion
	if err := st.k.Restart(); err != nil {
		t.Fatal(err)
	}
	st.produce(t, kafka.Message{Key: []byte("k"), Value: []byte("2"), Headers: idHeader("2")},
		kafka.Message{Key: []byte("k"), Value: []byte("1"), Headers: idHeader("1")})
	idemqtest.WaitFor(t, "the message produced after the outage applied", func() bool { return st.seen.count(consumer.Applied) == 2 })
	idemqtest.WaitFor(t, "the re-sent one recognised", func() bool { return st.seen.count(consumer.Duplicate) >= 1 })
}

func TestNewSubscriberValidates(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	good := subscriberConfig(st.k, "g")
	for name, mutate := range map[string]func(*idemqkafka.SubscriberConfig){
		"no brokers":   func(c *idemqkafka.SubscriberConfig) { c.Brokers = nil },
		"no group":     func(c *idemqkafka.SubscriberConfig) { c.GroupID = "" },
		"no topics":    func(c *idemqkafka.SubscriberConfig) { c.Topics = nil },
		"dlq is input": func(c *idemqkafka.SubscriberConfig) { c.DeadLetterTopic = c.Topics[0] },
		"negative":     func(c *idemqkafka.SubscriberConfig) { c.MaxBatch = -1 },
		"start offset": func(c *idemqkafka.SubscriberConfig) { c.StartOffset = 42 },
		"session":      func(c *idemqkafka.SubscriberConfig) { c.SessionTimeout = -time.Second },
		"heartbeat":    func(c *idemqkafka.SubscriberConfig) { c.HeartbeatInterval = -time.Second },
		"rebalance":    func(c *idemqkafka.SubscriberConfig) { c.RebalanceTimeout = -time.Second },
		"rebalance ms": func(c *idemqkafka.SubscriberConfig) { c.RebalanceTimeout = 1 << 62 },
		"heartbeat not below session": func(c *idemqkafka.SubscriberConfig) {
			c.HeartbeatInterval, c.SessionTimeout = 10*time.Second, 10*time.Second
		},
		"heartbeat not below default session": func(c *idemqkafka.SubscriberConfig) {
			c.HeartbeatInterval, c.SessionTimeout = time.Minute, 0
		},
	} {
		cfg := good
		mutate(&cfg)
		if _, err := idemqkafka.NewSubscriber(st.c, cfg); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	if _, err := idemqkafka.NewSubscriber(nil, good); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("nil consumer: %v, want ErrConfig", err)
	}
}

func TestSubscriberRedeliverModeCountsDeliveries(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) { t.Parallel(); testRedeliverMode(t, batch) })
	}
}

func testRedeliverMode(t *testing.T, batch bool) {
	st := newSetup(t)
	var mu sync.Mutex
	deliveries := map[string][]int{}
	var order []string
	c, err := consumer.New(testenv.Postgres(t), "redeliver", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		deliveries[msg.ID] = append(deliveries[msg.ID], msg.Delivery)
		switch {
		case msg.ID == "always-fails":
			return errors.New("still down")
		case msg.ID == "fails-twice" && len(deliveries[msg.ID]) <= 2:
			return errors.New("not yet")
		}
		order = append(order, msg.ID)
		return nil
	}, consumer.Config{Redeliver: true, Retry: idemq.Retry{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
		Hooks: consumer.Hooks{OnResult: st.seen.onResult}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(st.ctx); err != nil {
		t.Fatal(err)
	}
	st.c = c
	key := []byte("one-partition")
	st.produce(t,
		kafka.Message{Key: key, Value: []byte("x"), Headers: idHeader("fails-twice")},
		kafka.Message{Key: key, Value: []byte("x"), Headers: idHeader("always-fails")},
		kafka.Message{Key: key, Value: []byte("x"), Headers: idHeader("last")},
	)
	st.subscriber(t, func(c *idemqkafka.SubscriberConfig) { c.Batch = batch })
	idemqtest.WaitFor(t, "two applied and one dead-lettered", func() bool {
		return st.seen.count(consumer.Applied) == 2 && st.seen.count(consumer.DeadLettered) == 1
	})

	mu.Lock()
	defer mu.Unlock()
	// In a batch a handler that succeeded runs again, its first run rolled
	// back, when a later message of the pass fails: count deliveries, not
	// calls.
	if got := slices.Compact(deliveries["fails-twice"]); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("fails-twice delivered as %v, want [1 2 3]", got)
	}
	if got := slices.Compact(deliveries["always-fails"]); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("always-fails delivered as %v, want [1 2 3] then dead-lettered", got)
	}
	if st.seen.count(consumer.DeadLettered) != 1 {
		t.Errorf("dead letters %d, want 1", st.seen.count(consumer.DeadLettered))
	}
	// Batch mode applies a message retried after its batch committed after
	// the later messages of that batch; per-message mode keeps order.
	if !batch && !slices.Equal(order, []string{"fails-twice", "last"}) {
		t.Errorf("applied in order %v", order)
	}
}

func TestSubscriberAppliesEmptyAndTombstoneRecords(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	st.produce(t,
		kafka.Message{Key: []byte("k"), Value: nil, Headers: idHeader("tombstone")},
		kafka.Message{Key: []byte("k"), Value: []byte{}, Headers: idHeader("empty")},
	)
	st.subscriber(t, nil)
	idemqtest.WaitFor(t, "both records settled", func() bool {
		return st.seen.count(consumer.Applied)+st.seen.count(consumer.DeadLettered) == 2
	})
	if a, d := st.seen.count(consumer.Applied), st.seen.count(consumer.DeadLettered); a != 2 || d != 0 {
		t.Errorf("applied %d, dead-lettered %d; want 2 and 0 (errors %v)", a, d, st.seen.errs)
	}
	if n := st.seen.effects.Total(t); n != 2 {
		t.Errorf("%d effect rows, want 2", n)
	}
}

func TestSubscriberWarnsOnceAboutIDHeaderCase(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	logs := &captured{}
	for i := range 3 {
		st.produce(t, kafka.Message{Key: []byte("k"), Value: []byte("x"),
			Headers: []kafka.Header{{Key: "idempotency-key", Value: fmt.Appendf(nil, "id-%d", i)}}})
	}
	st.subscriber(t, func(c *idemqkafka.SubscriberConfig) { c.Logger = slog.New(logs) })
	idemqtest.WaitFor(t, "the three records applied", func() bool { return st.seen.count(consumer.Applied) == 3 })
	if n := logs.count(slog.LevelWarn, "letter case"); n != 1 {
		t.Errorf("%d warnings about the id header's letter case, want 1", n)
	}
	st.seen.mu.Lock()
	defer st.seen.mu.Unlock()
	for id, m := range st.seen.msgs {
		if id != idemqkafka.FallbackID(m) {
			t.Errorf("record got id %q, want the fallback %q", id, idemqkafka.FallbackID(m))
		}
	}
}

// captured is a slog.Handler that keeps every record.
type captured struct {
	mu      sync.Mutex
	records []slog.Record
}

func (c *captured) Enabled(context.Context, slog.Level) bool { return true }
func (c *captured) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *captured) WithGroup(string) slog.Handler            { return c }
func (c *captured) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r)
	return nil
}

// count returns the records at level whose message contains substr.
func (c *captured) count(level slog.Level, substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.records {
		if r.Level == level && strings.Contains(r.Message, substr) {
			n++
		}
	}
	return n
}

// Run after Run: the Subscriber opens a fresh dead-letter writer each time
// (the first Run closed its own), refuses a concurrent Run, and is Ready
// once it joined the group.
func TestSubscriberRunsAgainAfterRun(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	cfg := subscriberConfig(st.k, st.k.Group("g"))
	cfg.DeadLetterTopic = st.k.Topic("orders.dlq")
	s, err := idemqkafka.NewSubscriber(st.c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunTwice(t, s, func(round int) {
		// An empty id header: the consumer dead-letters the record.
		st.produce(t, kafka.Message{Key: []byte("k"), Value: []byte("bad"), Headers: idHeader("")})
		idemqtest.WaitFor(t, "the dead letter on the dead-letter topic", func() bool {
			msgs, err := st.k.ReadAll(st.ctx, st.k.Topic("orders.dlq"))
			if err != nil {
				t.Fatal(err)
			}
			return len(msgs) == round+1
		})
	})
}

// A Run after a crashed Run starts clean: the crash of the first (a
// Test.BeforeCommit veto) does not stop the second from committing.
func TestSubscriberRunsAgainAfterACrash(t *testing.T) {
	t.Parallel()
	st := newSetup(t)
	errKilled := errors.New("killed")
	var crashed atomic.Bool
	cfg := subscriberConfig(st.k, st.k.Group("g"))
	cfg.Test.BeforeCommit = func(context.Context, []*consumer.Message, []consumer.Result) error {
		if crashed.CompareAndSwap(false, true) {
			return errKilled
		}
		return nil
	}
	s, err := idemqkafka.NewSubscriber(st.c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st.produce(t, kafka.Message{Key: []byte("k"), Value: []byte("a"), Headers: idHeader("a")})
	if err := s.Run(st.ctx); !errors.Is(err, errKilled) {
		t.Fatalf("first Run: %v, want the crash", err)
	}
	running, err := idemq.Start(st.ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	st.produce(t, kafka.Message{Key: []byte("k"), Value: []byte("b"), Headers: idHeader("b")})
	idemqtest.WaitFor(t, "the redelivery and the new message settled", func() bool {
		return st.seen.count(consumer.Duplicate) == 1 && st.seen.count(consumer.Applied) == 2
	})
	if err := running.Stop(); err != nil {
		t.Fatalf("second Run: %v, want nil", err)
	}
}
