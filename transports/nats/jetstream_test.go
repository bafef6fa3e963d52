package nats_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqnats "github.com/idemq/idemq/transports/nats"
	"github.com/idemq/idemq/transports/transporttest"
)

// world is one test's NATS stream, database and bookkeeping.
type world struct {
	t    *testing.T
	ctx  context.Context
	e    *env
	pool *pgxpool.Pool
	fx   *idemqtest.Effects // the handler's side effects

	mu       sync.Mutex
	outcomes map[consumer.Outcome]int
	seen     []*consumer.Message // every message a handler saw, in order
}

func newWorld(t *testing.T) *world {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, e: newEnv(t, jetstream.StreamConfig{}), pool: testenv.Postgres(t), outcomes: map[consumer.Outcome]int{}}
	w.fx = idemqtest.NewEffects(t, w.pool)
	return w
}

// consumer returns a migrated consumer whose handler records an effects
// row after calling extra (if not nil).
func (w *world) consumer(cfg consumer.Config, extra func(ctx context.Context, msg *consumer.Message) error) *consumer.Consumer {
	cfg.Hooks.OnResult = func(r consumer.ResultEvent) {
		w.mu.Lock()
		w.outcomes[r.Outcome]++
		w.mu.Unlock()
	}
	if cfg.Retry.BaseDelay == 0 {
		cfg.Retry.BaseDelay, cfg.Retry.MaxDelay = 5*time.Millisecond, 50*time.Millisecond
	}
	c, err := consumer.New(w.pool, "orders", func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		w.mu.Lock()
		w.seen = append(w.seen, msg)
		w.mu.Unlock()
		if extra != nil {
			if err := extra(ctx, msg); err != nil {
				return err
			}
		}
		return w.fx.Record(ctx, tx, msg.ID)
	}, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := c.Migrate(w.ctx); err != nil {
		w.t.Fatal(err)
	}
	return c
}

func (w *world) count(o consumer.Outcome) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.outcomes[o]
}

func (w *world) effects() map[string]int {
	w.t.Helper()
	return w.fx.Counts(w.t)
}

// waitFor polls cond until it holds, or fails the test when the world's
// context ends; it reports the outcomes so far.
func (w *world) waitFor(what string, cond func() bool) {
	w.t.Helper()
	idemqtest.WaitFor(w.t, what, cond, idemqtest.Until(w.ctx), idemqtest.Explain(func() string {
		w.mu.Lock()
		defer w.mu.Unlock()
		return fmt.Sprint("outcomes ", w.outcomes)
	}))
}

// publish publishes raw messages with the given ids ("" = no header).
func (w *world) publish(ids ...string) {
	w.t.Helper()
	for i, id := range ids {
		m := nats.NewMsg(w.e.subject)
		m.Data = fmt.Appendf(nil, "payload-%d", i)
		if id != "" {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
		m.Header.Set("Tenant", "acme")
		if _, err := w.e.js.PublishMsg(w.ctx, m); err != nil {
			w.t.Fatal(err)
		}
	}
}

// durable creates a durable pull consumer on the stream.
func (w *world) durable(name string, cfg jetstream.ConsumerConfig) jetstream.Consumer {
	w.t.Helper()
	cfg.Durable = name
	if cfg.AckPolicy == 0 {
		cfg.AckPolicy = jetstream.AckExplicitPolicy
	}
	c, err := w.e.stream.CreateOrUpdateConsumer(w.ctx, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

// start runs a subscriber until the test ends (or Stop).
func (w *world) start(c *consumer.Consumer, cons jetstream.Consumer, cfg idemqnats.JetStreamSubscriberConfig) *idemq.Running {
	w.t.Helper()
	if cfg.FetchWait == 0 {
		cfg.FetchWait = 200 * time.Millisecond
	}
	s, err := idemqnats.NewJetStreamSubscriber(c, cons, w.e.js, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	running, err := idemq.Start(w.ctx, s)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = running.Stop() })
	return running
}

func (w *world) consumerInfo(cons jetstream.Consumer) *jetstream.ConsumerInfo {
	w.t.Helper()
	info, err := cons.Info(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	return info
}

func TestJetStreamMessageReachesHandler(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.publish("order-1", "")
	w.start(w.consumer(consumer.Config{}, nil), w.durable("d", jetstream.ConsumerConfig{}), idemqnats.JetStreamSubscriberConfig{})
	w.waitFor("both applied", func() bool { return w.count(consumer.Applied) == 2 })
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, want := range []string{"order-1", w.e.n.Name("ORDERS") + "/2"} {
		m := w.seen[i]
		raw, ok := idemqnats.JetStreamSource(m)
		switch {
		case m.ID != want:
			t.Errorf("message %d: ID %q, want %q", i, m.ID, want)
		case !ok || raw.Subject() != w.e.subject || idemqnats.Subject(m) != w.e.subject:
			t.Errorf("message %d: Source %T does not carry the subject %s", i, m.Source, w.e.subject)
		case m.Headers["Tenant"] != "acme":
			t.Errorf("message %d: headers %v", i, m.Headers)
		case m.Delivery != 1:
			t.Errorf("message %d: Delivery %d, want 1", i, m.Delivery)
		}
	}
}

// A subscriber killed after the commit and before the ack: the server
// redelivers after AckWait, the inbox sees a duplicate, the handler ran
// once.
func TestJetStreamCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.publish("a", "b", "c")
	cons := w.durable("d", jetstream.ConsumerConfig{AckWait: time.Second})
	c := w.consumer(consumer.Config{}, nil)
	var hookSeen []*consumer.Message
	errKilled := errors.New("killed")
	first := w.start(c, cons, idemqnats.JetStreamSubscriberConfig{
		Test: idemqnats.TestConfig{BeforeAck: func(_ context.Context, msgs []*consumer.Message, rs []consumer.Result) error {
			hookSeen = append(hookSeen, msgs...)
			if msgs[0].ID == "b" {
				return errKilled
			}
			return nil
		}},
	})
	<-first.Done()
	if err := first.Stop(); !errors.Is(err, errKilled) {
		t.Fatalf("Run after the crash = %v, want the hook's error", err)
	}
	w.start(c, cons, idemqnats.JetStreamSubscriberConfig{})
	w.waitFor("all three settled after the restart", func() bool { return len(w.effects()) == 3 && w.count(consumer.Duplicate) == 1 })
	for id, n := range w.effects() {
		if n != 1 {
			t.Errorf("message %s applied %d times", id, n)
		}
	}
	w.waitFor("nothing left pending", func() bool { return w.consumerInfo(cons).NumAckPending == 0 })
	if info := w.consumerInfo(cons); info.NumRedelivered != 0 || info.AckFloor.Stream != 3 {
		t.Errorf("consumer state: ack floor %d, redelivered pending %d; want 3 and 0", info.AckFloor.Stream, info.NumRedelivered)
	}
}

// Two subscriptions (two durables) get one message at the same moment; the
// second blocks on the first one's inbox row, then sees a duplicate.
func TestJetStreamTwoConsumersRaceOnOneMessage(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	release := make(chan struct{})
	var entered atomic.Int32
	c := w.consumer(consumer.Config{}, func(ctx context.Context, _ *consumer.Message) error {
		if entered.Add(1) == 1 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	w.publish("race-1")
	w.start(c, w.durable("a", jetstream.ConsumerConfig{}), idemqnats.JetStreamSubscriberConfig{})
	w.waitFor("the first handler running", func() bool { return entered.Load() == 1 })
	w.start(c, w.durable("b", jetstream.ConsumerConfig{}), idemqnats.JetStreamSubscriberConfig{})
	// The second claim waits on the first transaction's row lock.
	w.waitFor("the second claim blocked on the first", func() bool {
		var n int
		err := w.pool.QueryRow(w.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n == 1
	})
	close(release)
	w.waitFor("both settled", func() bool { return w.count(consumer.Applied)+w.count(consumer.Duplicate) == 2 })
	if a, d, n := w.count(consumer.Applied), w.count(consumer.Duplicate), w.effects()["race-1"]; a != 1 || d != 1 || n != 1 {
		t.Fatalf("applied %d, duplicates %d, effects %d; want 1, 1, 1", a, d, n)
	}
}

// The in-process server restarts while a subscriber and a relay sink are
// busy; everything published is applied once and Run carries on.
func TestJetStreamServerRestartMidRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	if w.e.n.External() {
		t.Skip("restarting needs the in-process server; " + testenv.NATSURLEnv + " is set")
	}
	sink, err := idemqnats.NewJetStreamSink(w.e.js, idemqnats.SinkConfig{AckTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	batch := relayBatch(w.e.subject, 200, 10)
	if err := sink.Publish(w.ctx, 0, batch[:100]); err != nil {
		t.Fatal(err)
	}
	c := w.consumer(consumer.Config{}, func(context.Context, *consumer.Message) error {
		time.Sleep(time.Millisecond)
		return nil
	})
	sub := w.start(c, w.durable("d", jetstream.ConsumerConfig{AckWait: 2 * time.Second}), idemqnats.JetStreamSubscriberConfig{MaxBatch: 10})
	w.waitFor("some applied", func() bool { return w.count(consumer.Applied) >= 20 })
	if err := w.e.n.Restart(); err != nil {
		t.Fatal(err)
	}
	// The relay keeps publishing the rest, retrying what failed while the
	// server was away (with the same ids).
	rest := batch[100:]
	for len(rest) > 0 && w.ctx.Err() == nil {
		err := sink.Publish(w.ctx, 0, rest)
		var failed []int
		if perr := (*relay.PublishError)(nil); errors.As(err, &perr) {
			for i := range perr.Failed {
				failed = append(failed, i)
			}
		} else if err != nil {
			for i := range rest {
				failed = append(failed, i)
			}
		}
		slices.Sort(failed)
		again := rest[:0:0]
		for _, i := range failed {
			again = append(again, rest[i])
		}
		rest = again
		if len(rest) > 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	w.waitFor("every message applied", func() bool { return len(w.effects()) == len(batch) })
	select {
	case <-sub.Done():
		t.Fatalf("the subscriber stopped: %v", sub.Stop())
	default:
	}
	if err := sub.Stop(); err != nil {
		t.Fatalf("graceful Stop after the restart: %v", err)
	}
	for id, n := range w.effects() {
		if n != 1 {
			t.Errorf("message %s applied %d times", id, n)
		}
	}
}

func TestJetStreamMissingAndOversizedMsgID(t *testing.T) {
	t.Parallel()
	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprintf("FallbackOnInvalidID=%v", fallback), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			dlqSubj := w.e.n.Name("dlq")
			dlq, err := w.e.n.CreateStream(w.ctx, w.e.js, jetstream.StreamConfig{Name: w.e.n.Name("DLQ"), Subjects: []string{dlqSubj}})
			if err != nil {
				t.Fatal(err)
			}
			oversized := strings.Repeat("x", 2000)
			w.publish("", oversized, "ok")
			cons := w.durable("d", jetstream.ConsumerConfig{})
			w.start(w.consumer(consumer.Config{}, nil), cons, idemqnats.JetStreamSubscriberConfig{FallbackOnInvalidID: fallback, DeadLetterSubject: dlqSubj})
			w.waitFor("all three settled", func() bool { return w.consumerInfo(cons).AckFloor.Stream == 3 })
			stream := w.e.n.Name("ORDERS")
			want := map[string]int{stream + "/1": 1, "ok": 1}
			if fallback {
				want[stream+"/2"] = 1
			}
			if got := w.effects(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("effects %v, want %v", got, want)
			}
			ids, err := streamIDs(w.ctx, dlq)
			if err != nil {
				t.Fatal(err)
			}
			if fallback && len(ids) != 0 {
				t.Errorf("dead letters %d, want none", len(ids))
			}
			if !fallback {
				if w.count(consumer.DeadLettered) != 1 || len(ids) != 1 {
					t.Errorf("dead-lettered %d, on the dead-letter subject %d; want 1 and 1", w.count(consumer.DeadLettered), len(ids))
				}
			}
		})
	}
}

// A handler running for longer than AckWait: InProgress keeps the message
// from being redelivered to the other member of the durable.
func TestJetStreamLongHandlerIsNotRedeliveredInParallel(t *testing.T) {
	// Not parallel: InProgress must reach the server within AckWait (1s), which parallel load on two cores can delay.
	w := newWorld(t)
	var calls atomic.Int32
	c := w.consumer(consumer.Config{}, func(ctx context.Context, msg *consumer.Message) error {
		calls.Add(1)
		if msg.Delivery != 1 {
			return fmt.Errorf("delivery %d of %s: AckWait expired under the handler", msg.Delivery, msg.ID)
		}
		time.Sleep(2500 * time.Millisecond) // 2.5 AckWaits
		return nil
	})
	cons := w.durable("d", jetstream.ConsumerConfig{AckWait: time.Second})
	w.publish("slow")
	for range 2 {
		w.start(c, cons, idemqnats.JetStreamSubscriberConfig{})
	}
	w.waitFor("applied", func() bool { return w.count(consumer.Applied) == 1 })
	w.waitFor("acked", func() bool { return w.consumerInfo(cons).AckFloor.Stream == 1 })
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once", n)
	}
}

// Retry outcomes become NakWithDelay; the consumer counts attempts by the
// delivery count.
func TestJetStreamRetryIsRedelivered(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("Batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			var deliveries []int
			c := w.consumer(consumer.Config{Redeliver: true, Retry: idemq.Retry{MaxAttempts: 5}}, func(_ context.Context, msg *consumer.Message) error {
				deliveries = append(deliveries, msg.Delivery)
				if msg.Delivery < 3 {
					return errors.New("flaky")
				}
				return nil
			})
			w.publish("flaky")
			w.start(c, w.durable("d", jetstream.ConsumerConfig{}), idemqnats.JetStreamSubscriberConfig{Batch: batch})
			w.waitFor("applied", func() bool { return w.count(consumer.Applied) == 1 })
			w.mu.Lock()
			defer w.mu.Unlock()
			if fmt.Sprint(deliveries) != "[1 2 3]" || w.outcomes[consumer.Retry] != 2 {
				t.Fatalf("deliveries %v, retries %d; want [1 2 3] and 2", deliveries, w.outcomes[consumer.Retry])
			}
		})
	}
}

// Cancelling Run finishes and acknowledges what was fetched.
func TestJetStreamGracefulShutdownAcksInFlight(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("Batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			ids := make([]string, 30)
			for i := range ids {
				ids[i] = fmt.Sprint("m", i)
			}
			w.publish(ids...)
			started := make(chan struct{}, len(ids))
			c := w.consumer(consumer.Config{}, func(context.Context, *consumer.Message) error {
				started <- struct{}{}
				time.Sleep(5 * time.Millisecond)
				return nil
			})
			cons := w.durable("d", jetstream.ConsumerConfig{})
			sub := w.start(c, cons, idemqnats.JetStreamSubscriberConfig{Batch: batch, MaxBatch: 30})
			<-started
			if err := sub.Stop(); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			info := w.consumerInfo(cons)
			if info.NumAckPending != 0 || int(info.AckFloor.Stream) != len(w.effects()) {
				t.Fatalf("after Stop: %d pending acks, ack floor %d, %d applied; want 0 pending and the floor at the applied count",
					info.NumAckPending, info.AckFloor.Stream, len(w.effects()))
			}
		})
	}
}

func TestNewJetStreamSubscriberValidates(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	c := w.consumer(consumer.Config{}, nil)
	none := w.durable("none", jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if _, err := idemqnats.NewJetStreamSubscriber(c, none, nil, idemqnats.JetStreamSubscriberConfig{}); !errors.Is(err, idemq.ErrConfig) {
		t.Errorf("AckNone consumer: %v", err)
	}
	explicit := w.durable("explicit", jetstream.ConsumerConfig{AckWait: time.Second})
	for _, cfg := range []idemqnats.JetStreamSubscriberConfig{
		{InProgressInterval: time.Second},
		{DeadLetterSubject: "dlq"}, // no JetStream to publish with
		{MaxBatch: -1},
		{Retry: idemq.Retry{BaseDelay: time.Second, MaxDelay: time.Millisecond}},
		{Retry: idemq.Retry{BaseDelay: time.Minute}}, // above the default MaxDelay
	} {
		if _, err := idemqnats.NewJetStreamSubscriber(c, explicit, nil, cfg); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// The same id with another payload is a Conflict: never applied, copied to
// the dead-letter subject with its outcome, terminated. The id travels in
// a header of the application's choice here, so the stream does not drop
// the second message as a duplicate.
func TestJetStreamConflictIsDeadLetteredAndTerminated(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dlqSubj := w.e.n.Name("dlq")
	dlq, err := w.e.n.CreateStream(w.ctx, w.e.js, jetstream.StreamConfig{Name: w.e.n.Name("DLQ"), Subjects: []string{dlqSubj}})
	if err != nil {
		t.Fatal(err)
	}
	for _, payload := range []string{"qty=1", "qty=2"} {
		m := nats.NewMsg(w.e.subject)
		m.Data = []byte(payload)
		m.Header.Set("Idempotency-Key", "order-7")
		if _, err := w.e.js.PublishMsg(w.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cons := w.durable("d", jetstream.ConsumerConfig{})
	w.start(w.consumer(consumer.Config{}, nil), cons, idemqnats.JetStreamSubscriberConfig{IDHeader: "Idempotency-Key", DeadLetterSubject: dlqSubj})
	w.waitFor("both settled", func() bool { return w.consumerInfo(cons).AckFloor.Stream == 2 })
	if a, c, n := w.count(consumer.Applied), w.count(consumer.Conflict), w.effects()["order-7"]; a != 1 || c != 1 || n != 1 {
		t.Fatalf("applied %d, conflicts %d, effects %d; want 1, 1, 1", a, c, n)
	}
	got, err := dlq.GetMsg(w.ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != "qty=2" || got.Header.Get(consumer.HeaderDeadLetterOutcome) != consumer.Conflict.String() ||
		got.Header.Get(consumer.HeaderDeadLetterReason) == "" || got.Header.Get(idemqnats.HeaderDeadLetterID) != "order-7" {
		t.Fatalf("dead letter %q with headers %v", got.Data, got.Header)
	}
}

// A dead-letter subject that the input's own stream captures gets its
// copy: with the original's Nats-Msg-Id the stream would drop it as a
// duplicate of the original.
func TestJetStreamDeadLetterIntoTheInputStream(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	dlqSubj := w.e.subject + "-dlq"
	info, err := w.e.stream.Info(w.ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.Subjects = append(cfg.Subjects, dlqSubj)
	if _, err := w.e.js.UpdateStream(w.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	w.publish("poison-1")
	cons := w.durable("d", jetstream.ConsumerConfig{FilterSubject: w.e.subject})
	c := w.consumer(consumer.Config{}, func(context.Context, *consumer.Message) error {
		return idemq.Permanent(errors.New("poison"))
	})
	w.start(c, cons, idemqnats.JetStreamSubscriberConfig{DeadLetterSubject: dlqSubj})
	w.waitFor("the poison message terminated", func() bool { return w.consumerInfo(cons).AckFloor.Stream == 1 })
	got, err := w.e.stream.GetLastMsgForSubject(w.ctx, dlqSubj)
	if err != nil {
		t.Fatalf("the dead-letter copy is not in the stream: %v", err)
	}
	if got.Header.Get(idemqnats.HeaderDeadLetterID) != "poison-1" || got.Header.Get(jetstream.MsgIDHeader) == "poison-1" {
		t.Errorf("dead letter headers %v", got.Header)
	}
	if n := len(w.effects()); n != 0 || w.count(consumer.DeadLettered) != 1 {
		t.Errorf("%d effects, %d dead letters; want 0 and 1", n, w.count(consumer.DeadLettered))
	}
}

// Run after Run, and a second concurrent Run refused; Ready once the first
// fetch is out.
func TestJetStreamSubscriberRunsAgainAfterRun(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	cons := w.durable("d", jetstream.ConsumerConfig{})
	s, err := idemqnats.NewJetStreamSubscriber(w.consumer(consumer.Config{}, nil), cons, w.e.js,
		idemqnats.JetStreamSubscriberConfig{FetchWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	transporttest.RunTwice(t, s, func(round int) {
		w.publish(fmt.Sprint("m-", round))
		w.waitFor("the message applied", func() bool { return len(w.effects()) == round+1 })
	})
}

// A Run after a crashed Run starts clean: the crash of the first (a
// Test.BeforeAck veto) does not keep the second from applying.
func TestJetStreamSubscriberRunsAgainAfterACrash(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	errKilled := errors.New("killed")
	var crashed atomic.Bool
	s, err := idemqnats.NewJetStreamSubscriber(w.consumer(consumer.Config{}, nil), w.durable("d", jetstream.ConsumerConfig{AckWait: time.Second}), w.e.js,
		idemqnats.JetStreamSubscriberConfig{FetchWait: 100 * time.Millisecond, Test: idemqnats.TestConfig{
			BeforeAck: func(context.Context, []*consumer.Message, []consumer.Result) error {
				if crashed.CompareAndSwap(false, true) {
					return errKilled
				}
				return nil
			}}})
	if err != nil {
		t.Fatal(err)
	}
	w.publish("a")
	if err := s.Run(w.ctx); !errors.Is(err, errKilled) {
		t.Fatalf("first Run: %v, want the crash", err)
	}
	running, err := idemq.Start(w.ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	w.publish("b")
	w.waitFor("the redelivery and the new message settled", func() bool {
		return w.count(consumer.Duplicate) == 1 && len(w.effects()) == 2
	})
	if err := running.Stop(); err != nil {
		t.Fatalf("second Run: %v, want nil", err)
	}
}
