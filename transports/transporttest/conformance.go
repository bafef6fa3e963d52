package transporttest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// waitTimeout bounds how long a scenario waits for messages to be applied
// before it fails. It is a deadlock guard, not a timing assertion: on a
// healthy machine every scenario finishes in seconds.
const waitTimeout = 90 * time.Second

// Run runs every scenario against a transport. newHarness is called once
// per scenario, with that scenario's t, and must return a Harness on a
// fresh stream, sharing no state with another scenario's harness: the
// scenarios of a mode run in parallel (t.Parallel). With Features.Batch
// each runs in per-message and in batch mode.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	modes := []mode{{name: "PerMessage"}}
	if newHarness == nil {
		t.Fatal("transporttest: nil harness constructor")
	}
	scenarios := []struct {
		name string
		fn   func(*fixture)
	}{
		{"PublisherDuplicates", publisherDuplicates},
		{"MissingID", missingID},
		{"CrashBetweenCommitAndAck", crashBetweenCommitAndAck},
		{"RacingSubscriptions", racingSubscriptions},
		{"GroupMemberLeaves", groupMemberLeaves},
		{"MalformedID", malformedID},
		{"PoisonMessage", poisonMessage},
		{"RelayRepublish", relayRepublish},
		{"RelayCrash", relayCrash},
		{"OrderedPerKey", orderedPerKey},
		{"DatabaseOutage", databaseOutage},
	}
	// Features do not depend on the stream; ask a throwaway harness once
	// to decide on batch mode.
	t.Run("Features", func(t *testing.T) {
		if newHarness(t).Features().Batch {
			modes = append(modes, mode{name: "Batch", batch: true}, mode{name: "BatchHandler", batch: true, batchHandler: true})
		}
	})
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel() // each scenario has its own database and stream
					sc.fn(newFixture(t, newHarness(t), m))
				})
			}
		})
	}
}

// mode is how the scenarios consume: message by message, in the
// transport's batch mode, or in batch mode with a consumer.BatchHandler.
type mode struct {
	name                string
	batch, batchHandler bool
}

// fixture is one scenario's world: a harness on a fresh stream, a fresh
// database with the business table, and counters of every outcome.
type fixture struct {
	t    *testing.T
	h    Harness
	f    Features
	mode mode
	pool *pgxpool.Pool
	ctx  context.Context
	fx   *idemqtest.Effects // one row per application

	mu       sync.Mutex
	outcomes map[consumer.Outcome]int
	byID     map[string][]consumer.Outcome
	attempts sync.Map // payload -> *atomic.Int32, for flaky messages
	groups   atomic.Int32

	// logger, if set, is the consumers' and subscribers' logger;
	// onResult, if set, sees every result after it was counted.
	logger   *slog.Logger
	onResult func(consumer.Result)
}

func newFixture(t *testing.T, h Harness, m mode) *fixture {
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	t.Cleanup(cancel)
	fx := &fixture{
		t: t, h: h, f: h.Features(), mode: m,
		pool:     testenv.Postgres(t),
		ctx:      ctx,
		outcomes: map[consumer.Outcome]int{},
		byID:     map[string][]consumer.Outcome{},
	}
	// The business table has no unique constraint on purpose: a message
	// applied twice shows up as two rows.
	fx.fx = idemqtest.NewEffects(t, fx.pool)
	return fx
}

// consumer returns a migrated transactional consumer of scope whose
// handler inserts one effects row per application; payloads starting with
// "poison" fail permanently, "flaky" ones fail twice before succeeding. In
// BatchHandler mode its batch handler inserts a whole batch's rows in one
// statement.
func (fx *fixture) consumer(scope string) *consumer.Consumer {
	cfg := consumer.Config{
		Retry:  idemq.Retry{MaxAttempts: 4, BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Hooks:  consumer.Hooks{OnResult: fx.record},
		Logger: fx.logger,
	}
	newConsumer := func() (*consumer.Consumer, error) { return consumer.New(fx.pool, scope, fx.handle, cfg) }
	if fx.mode.batchHandler {
		newConsumer = func() (*consumer.Consumer, error) { return consumer.NewBatched(fx.pool, scope, fx.handleAll, cfg) }
	}
	c, err := newConsumer()
	if err != nil {
		fx.t.Fatal(err)
	}
	if err := c.Migrate(fx.ctx); err != nil {
		fx.t.Fatal(err)
	}
	return c
}

func (fx *fixture) handle(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
	if err := fx.check(msg); err != nil {
		return err
	}
	return fx.fx.Record(ctx, tx, msg.ID)
}

// check fails the messages that the scenarios make fail.
func (fx *fixture) check(msg *consumer.Message) error {
	p := string(msg.Payload)
	switch {
	case strings.HasPrefix(p, "poison"):
		return idemq.Permanent(errors.New("transporttest: poison message"))
	case strings.HasPrefix(p, "flaky"):
		n, _ := fx.attempts.LoadOrStore(p, new(atomic.Int32))
		if n.(*atomic.Int32).Add(1) <= 2 {
			return errors.New("transporttest: flaky failure")
		}
	case strings.HasPrefix(p, "slow"):
		time.Sleep(2 * time.Millisecond)
	}
	if msg.ID == "" {
		return idemq.Permanent(errors.New("transporttest: the transport gave the message no id"))
	}
	return nil
}

func (fx *fixture) record(r consumer.ResultEvent) {
	fx.mu.Lock()
	fx.outcomes[r.Outcome]++
	fx.byID[r.Key] = append(fx.byID[r.Key], r.Outcome)
	fx.mu.Unlock()
	if fx.onResult != nil {
		fx.onResult(r.Result)
	}
}

func (fx *fixture) count(o consumer.Outcome) int {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return fx.outcomes[o]
}

// settled counts the settled outcomes seen so far.
func (fx *fixture) settled() int {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	n := 0
	for o, c := range fx.outcomes {
		if o != consumer.Retry {
			n += c
		}
	}
	return n
}

// subscribe starts the harness's subscriber with idemq.Start (so it is
// ready: joined, subscribed) and stops it at the end of the test.
func (fx *fixture) subscribe(c *consumer.Consumer, group string, crash func(*consumer.Message, consumer.Result) bool) *idemq.Running {
	fx.t.Helper()
	return fx.start(fx.h.Subscriber(c, SubscribeOptions{Group: group, Batch: fx.mode.batch, Crash: crash, Logger: fx.logger}))
}

// start runs s until the end of the test.
func (fx *fixture) start(s idemq.Service) *idemq.Running {
	fx.t.Helper()
	running, err := idemq.Start(fx.ctx, s)
	if err != nil {
		fx.t.Fatalf("transporttest: start: %v", err)
	}
	fx.t.Cleanup(func() { _ = running.Stop() })
	return running
}

func (fx *fixture) publish(msgs ...Message) {
	fx.t.Helper()
	if err := fx.h.Publish(fx.ctx, msgs...); err != nil {
		fx.t.Fatalf("publish: %v", err)
	}
}

// effects returns how many rows each message id produced.
func (fx *fixture) effects() map[string]int {
	fx.t.Helper()
	return fx.fx.Counts(fx.t)
}

// waitFor polls cond until it holds; after waitTimeout it fails the test
// with what was awaited and the state.
func (fx *fixture) waitFor(what string, cond func() bool) {
	fx.t.Helper()
	idemqtest.WaitFor(fx.t, what, cond, idemqtest.Within(waitTimeout), idemqtest.Until(fx.ctx), idemqtest.Explain(func() string {
		fx.mu.Lock()
		state := fmt.Sprint(fx.outcomes)
		fx.mu.Unlock()
		return fmt.Sprintf("transporttest: outcomes so far %s, effects %d ids", state, len(fx.effects()))
	}))
}

// appliedOnce asserts that every id in ids produced exactly one row and
// nothing else did.
func (fx *fixture) appliedOnce(ids []string) {
	fx.t.Helper()
	fx.fx.AssertOnce(fx.t, ids...)
}

func (fx *fixture) group(name string) string {
	return fmt.Sprintf("%s-%d", name, fx.groups.Add(1))
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

func messages(n int, keys int, prefix string) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{ID: newID(), Key: fmt.Sprintf("key-%d", i%keys), Payload: fmt.Appendf(nil, "%s-%d", prefix, i)}
	}
	return msgs
}

func ids(msgs []Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

// publisherDuplicates: a producer that retries sends every message twice
// and some five times; each is applied once.
func publisherDuplicates(fx *fixture) {
	msgs := messages(40, 5, "dup")
	var sends []Message
	for round := range 5 {
		for i, m := range msgs {
			if round < 2 || i%8 == 0 {
				sends = append(sends, m)
			}
		}
	}
	fx.publish(sends...)
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("every send settled", func() bool { return fx.settled() >= len(sends) })
	fx.appliedOnce(ids(msgs))
	if a, d := fx.count(consumer.Applied), fx.count(consumer.Duplicate); a != len(msgs) || d != len(sends)-len(msgs) {
		fx.t.Errorf("applied %d, duplicates %d; want %d and %d", a, d, len(msgs), len(sends)-len(msgs))
	}
}

// missingID: messages without an id header get the transport's fallback
// id and are each applied once; with Features.RequiresID they are refused
// and the messages after them applied.
func missingID(fx *fixture) {
	msgs := messages(10, 2, "noid")
	for i := range msgs {
		msgs[i].ID = ""
	}
	if fx.f.RequiresID {
		after := messages(3, 1, "after")
		fx.publish(append(msgs, after...)...)
		fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
		fx.waitFor("the messages after the id-less ones applied", func() bool { return fx.count(consumer.Applied) >= len(after) })
		fx.appliedOnce(ids(after))
		return
	}
	fx.publish(msgs...)
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("every message applied", func() bool { return fx.count(consumer.Applied) >= len(msgs) })
	got := fx.effects()
	if len(got) != len(msgs) {
		fx.t.Errorf("%d distinct fallback ids applied, want %d: %v", len(got), len(msgs), got)
	}
	for id, n := range got {
		if n != 1 {
			fx.t.Errorf("fallback id %q applied %d times", id, n)
		}
	}
}

// crashBetweenCommitAndAck: the subscription dies after a transaction
// committed and before the ack; a restarted one gets the redelivery, sees
// a duplicate, and every message is applied once, none lost.
func crashBetweenCommitAndAck(fx *fixture) {
	if !fx.f.Redelivery {
		fx.t.Skip("the transport does not redeliver unacknowledged messages (Features.Redelivery is false)")
	}
	msgs := messages(40, 4, "crash")
	fx.publish(msgs...)
	group := fx.group("g")
	var applied atomic.Int32
	first := fx.subscribe(fx.consumer("orders"), group, func(_ *consumer.Message, r consumer.Result) bool {
		return r.Outcome == consumer.Applied && applied.Add(1) >= 15
	})
	select {
	case <-first.Done():
	case <-time.After(waitTimeout):
		fx.t.Fatal("transporttest: the crashing subscription never crashed")
	}
	if err := first.Stop(); err == nil {
		fx.t.Error("Stop after a crash returned nil, want the crash")
	}
	fx.subscribe(fx.consumer("orders"), group, nil)
	fx.waitFor("every message applied after the restart", func() bool { return len(fx.effects()) >= len(msgs) })
	fx.waitFor("the redelivery recognised as a duplicate", func() bool { return fx.count(consumer.Duplicate) >= 1 })
	fx.appliedOnce(ids(msgs))
}

// racingSubscriptions: two subscriptions in different groups both receive
// every message and race on the same inbox scope; each message is
// applied once.
func racingSubscriptions(fx *fixture) {
	msgs := messages(40, 4, "race")
	fx.publish(msgs...)
	fx.subscribe(fx.consumer("orders"), fx.group("a"), nil)
	fx.subscribe(fx.consumer("orders"), fx.group("b"), nil)
	fx.waitFor("both subscriptions settled every message", func() bool { return fx.settled() >= 2*len(msgs) })
	fx.appliedOnce(ids(msgs))
	if a := fx.count(consumer.Applied); a != len(msgs) {
		fx.t.Errorf("applied %d, want %d", a, len(msgs))
	}
}

// groupMemberLeaves: two subscriptions share a group; one leaves
// mid-stream and the other takes over its share; each message is applied
// once.
func groupMemberLeaves(fx *fixture) {
	if !fx.f.SharedGroup {
		fx.t.Skip("the transport has no shared groups (Features.SharedGroup is false)")
	}
	msgs := messages(120, 12, "slow")
	group := fx.group("g")
	a := fx.subscribe(fx.consumer("orders"), group, nil)
	fx.subscribe(fx.consumer("orders"), group, nil)
	fx.publish(msgs[:60]...)
	fx.waitFor("a quarter applied", func() bool { return fx.count(consumer.Applied) >= 30 })
	if err := a.Stop(); err != nil {
		fx.t.Errorf("graceful Stop: %v", err)
	}
	fx.publish(msgs[60:]...)
	fx.publish(msgs[50:70]...) // the producer retries some
	fx.waitFor("every message applied by the remaining member", func() bool { return len(fx.effects()) >= len(msgs) })
	fx.appliedOnce(ids(msgs))
}

// malformedID: messages whose id is oversized (over the inbox's 1024-byte
// key limit) or not UTF-8 never stall the stream: each is dead-lettered or
// applied under a fallback id, at most once, and the messages after them
// are applied. A broker that refuses such a message at publish (the
// producer sees the error) passes too.
func malformedID(fx *fixture) {
	bad := []Message{
		{ID: strings.Repeat("x", 2000), Key: "key-0", Payload: []byte("oversized-id")},
		{ID: "\xff\xfe", Key: "key-0", Payload: []byte("not-utf8-id")},
	}
	accepted := 0
	for _, m := range bad {
		if err := fx.h.Publish(fx.ctx, m); err != nil {
			fx.t.Logf("the broker refused a message with a malformed id at publish: %v", err)
			continue
		}
		accepted++
	}
	after := messages(5, 1, "after")
	fx.publish(after...)
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("every delivery settled", func() bool { return fx.settled() >= accepted+len(after) })
	fx.waitFor("the messages after the malformed ones applied", func() bool {
		got := fx.effects()
		for _, m := range after {
			if got[m.ID] == 0 {
				return false
			}
		}
		return true
	})
	got := fx.effects()
	for _, m := range after {
		if got[m.ID] != 1 {
			fx.t.Errorf("message %s applied %d times, want once", m.ID, got[m.ID])
		}
		delete(got, m.ID)
	}
	for id, n := range got {
		if n != 1 {
			fx.t.Errorf("malformed-id message applied as %q %d times, want at most once", id, n)
		}
	}
}

// poisonMessage: a message whose handler fails permanently is
// dead-lettered and the stream moves on; a flaky one is retried and
// applied once.
func poisonMessage(fx *fixture) {
	msgs := messages(10, 1, "ok")
	poison := Message{ID: newID(), Key: "key-0", Payload: []byte("poison-1")}
	flaky := Message{ID: newID(), Key: "key-0", Payload: []byte("flaky-" + newID())}
	stream := slices.Concat(msgs[:5], []Message{poison}, msgs[5:], []Message{flaky})
	fx.publish(stream...)
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("the messages after the poison applied", func() bool { return fx.count(consumer.Applied) >= len(msgs)+1 })
	fx.waitFor("the poison message dead-lettered", func() bool { return fx.count(consumer.DeadLettered) >= 1 })
	fx.appliedOnce(append(ids(msgs), flaky.ID))
	if fx.f.DeadLetterDestination {
		fx.waitFor("the poison message on the dead-letter destination", func() bool {
			dl, err := fx.h.DeadLetters(fx.ctx)
			if err != nil {
				fx.t.Fatalf("dead letters: %v", err)
			}
			return slices.Contains(dl, poison.ID)
		})
	}
}

// relayRepublish: the relay publishes a batch through the transport's
// sink, crashes before deleting the rows, and its successor publishes the
// same rows again (same ids); each is applied once.
func relayRepublish(fx *fixture) {
	sink, dest := fx.h.Sink()
	batch := make([]relay.Message, 30)
	want := make([]string, len(batch))
	for i := range batch {
		id := uuid.Must(uuid.NewV7())
		batch[i] = relay.Message{Message: outbox.Message{ID: id, Destination: dest, Key: fmt.Sprintf("order-%d", i%3),
			Payload: fmt.Appendf(nil, `{"order":%d}`, i), Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
		want[i] = id.String()
	}
	if err := sink.Publish(fx.ctx, 0, batch); err != nil {
		fx.t.Fatalf("sink publish: %v", err)
	}
	if err := sink.Publish(fx.ctx, 0, batch[10:]); err != nil { // the relay's successor
		fx.t.Fatalf("sink republish: %v", err)
	}
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("every outbox message applied", func() bool { return len(fx.effects()) >= len(batch) })
	deliveries := len(batch) + 20
	if fx.f.PublishDedupe {
		deliveries = len(batch)
	}
	fx.waitFor("every delivery settled", func() bool { return fx.settled() >= deliveries })
	fx.appliedOnce(want)
}

// relayCrash: business transactions enqueue outbox messages; a relay
// publishes its first batch through the transport's sink and dies before
// deleting the rows; a second relay publishes those rows again; each outbox
// message is applied once.
func relayCrash(fx *fixture) {
	sink, dest := fx.h.Sink()
	ob, err := outbox.New(fx.pool, outbox.Config{})
	if err != nil {
		fx.t.Fatal(err)
	}
	if err := ob.Migrate(fx.ctx); err != nil {
		fx.t.Fatal(err)
	}
	const n, batch = 40, 15
	want := make([]string, n)
	for i := range n {
		id := uuid.Must(uuid.NewV7())
		want[i] = id.String()
		err := ob.Enqueue(fx.ctx, outbox.Message{ID: id, Destination: dest, Key: fmt.Sprintf("order-%d", i%4),
			Payload: fmt.Appendf(nil, `{"order":%d}`, i)})
		if err != nil {
			fx.t.Fatal(err)
		}
	}
	cfg := relay.Config{BatchSize: batch, PollInterval: 20 * time.Millisecond, Retry: idemq.Retry{BaseDelay: 5 * time.Millisecond,
		MaxDelay: 50 * time.Millisecond}, ShutdownGrace: 10 * time.Millisecond}

	// The first relay publishes one batch, then dies before its commit.
	published := make(chan int, 1)
	crashing := relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, msgs []relay.Message) error {
		if err := sink.Publish(ctx, 0, msgs); err != nil {
			return err
		}
		select {
		case published <- len(msgs):
		default:
		}
		<-ctx.Done() // killed before the delete commits
		return ctx.Err()
	})
	r1, err := relay.New(fx.pool, ob, crashing, cfg)
	if err != nil {
		fx.t.Fatal(err)
	}
	first := fx.start(r1)
	var sent int
	select {
	case sent = <-published:
	case <-time.After(waitTimeout):
		fx.t.Fatal("transporttest: the first relay never published")
	}
	if err := first.Stop(); err != nil {
		fx.t.Fatalf("first relay: %v", err)
	}

	r2, err := relay.New(fx.pool, ob, sink, cfg)
	if err != nil {
		fx.t.Fatal(err)
	}
	fx.start(r2)

	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("every outbox message applied", func() bool { return len(fx.effects()) >= n })
	deliveries := n + sent
	if fx.f.PublishDedupe {
		deliveries = n
	}
	fx.waitFor("every delivery settled, the republished ones included", func() bool { return fx.settled() >= deliveries })
	fx.appliedOnce(want)
}

// orderedPerKey: messages of one key are applied in publish order.
func orderedPerKey(fx *fixture) {
	if !fx.f.OrderedPerKey {
		fx.t.Skip("the transport does not keep per-key order (Features.OrderedPerKey is false)")
	}
	msgs := messages(60, 3, "seq")
	fx.publish(msgs...)
	fx.subscribe(fx.consumer("orders"), fx.group("g"), nil)
	fx.waitFor("every message applied", func() bool { return fx.count(consumer.Applied) >= len(msgs) })
	fx.inKeyOrder(msgs)
}

// inKeyOrder asserts that every message of msgs was applied, each after
// the messages of its key published before it.
func (fx *fixture) inKeyOrder(msgs []Message) {
	fx.t.Helper()
	applied := fx.fx.Load(fx.t).Sequence()
	pos := make(map[string]int, len(applied))
	for i, id := range applied {
		pos[id] = i
	}
	last := map[string]int{}
	for _, m := range msgs {
		p, ok := pos[m.ID]
		if !ok {
			fx.t.Fatalf("message %s not applied", m.ID)
		}
		if prev, seen := last[m.Key]; seen && p < prev {
			fx.t.Errorf("key %s: message %s applied before its predecessor", m.Key, m.ID)
		}
		last[m.Key] = p
	}
}
