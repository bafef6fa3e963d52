package inbound

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/testenv"
)

// fastRetry keeps the kernel's waits short.
var fastRetry = idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 4 * time.Millisecond}

// client records what the kernel asked of it; its dead-letter destination
// refuses the copy of message id refuse[id] times.
type client struct {
	settled   []string // ids, in settle order
	steps     []Action
	published []string
	released  []string
	refuse    map[string]int
	veto      error
}

func (c *client) DeadLetter(_ context.Context, msgs []*consumer.Message, _ []consumer.Result, dead []int) (int, error) {
	for j, i := range dead {
		if c.refuse[msgs[i].ID] > 0 {
			c.refuse[msgs[i].ID]--
			return j, errors.New("broker down")
		}
		c.published = append(c.published, msgs[i].ID)
	}
	return len(dead), nil
}

func (c *client) Settle(_ context.Context, msgs []*consumer.Message, _ []consumer.Result, steps []Step) error {
	if c.veto != nil {
		return c.veto
	}
	for i, m := range msgs {
		c.settled = append(c.settled, m.ID)
		c.steps = append(c.steps, steps[i].Action)
	}
	return nil
}

func (c *client) Release(msgs []*consumer.Message) {
	for _, m := range msgs {
		c.released = append(c.released, m.ID)
	}
}

func group(ids ...string) []*consumer.Message {
	msgs := make([]*consumer.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &consumer.Message{ID: id, Delivery: 1}
	}
	return msgs
}

// script returns a Process that gives round r's results for the messages
// of that round, by id: rounds[r][id], Applied when missing. It records
// the ids each round was given.
func script(rounds []map[string]consumer.Result, seen *[][]string) Process {
	return func(_ context.Context, msgs []*consumer.Message) []consumer.Result {
		r := len(*seen)
		var ids []string
		results := make([]consumer.Result, len(msgs))
		for i, m := range msgs {
			ids = append(ids, m.ID)
			results[i] = applied
			if r < len(rounds) {
				if res, ok := rounds[r][m.ID]; ok {
					results[i] = res
				}
			}
		}
		*seen = append(*seen, ids)
		return results
	}
}

// A database outage in the middle of a group: the messages before it
// settle, the held one and every one behind it are processed again, in
// order, until the database answers; none is handed back, and the log
// says once that the database is gone and once that it is back, with the
// count of the messages that waited.
func TestGroupHoldsThroughAnOutage(t *testing.T) {
	t.Parallel()
	var logs testenv.Logs
	k := New(Config{Retry: fastRetry, Redeliver: true, Logger: logs.Logger()})
	var seen [][]string
	rounds := []map[string]consumer.Result{
		{"b": down}, {"b": down}, {"b": down}, {"c": down}, {},
	}
	c := &client{}
	ctx := context.Background()
	msgs := group("a", "b", "c", "d")
	if err := k.Group(ctx, ctx, msgs, script(rounds, &seen), c); err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"a", "b", "c", "d"}, {"b", "c", "d"}, {"b", "c", "d"}, {"b", "c", "d"}, {"c", "d"}}
	if !slices.EqualFunc(seen, want, slices.Equal) {
		t.Fatalf("rounds processed %v, want %v", seen, want)
	}
	if !slices.Equal(c.settled, []string{"a", "b", "c", "d"}) || len(c.released) != 0 {
		t.Fatalf("settled %v released %v; want a, b, c, d in order and nothing handed back", c.settled, c.released)
	}
	for _, m := range msgs {
		if m.Delivery != 1 {
			t.Fatalf("message %s has delivery %d after an outage; an outage is not a delivery", m.ID, m.Delivery)
		}
	}
	gone, back := logs.Records("idemq: database unavailable"), logs.Records("idemq: database available again")
	if len(gone) != 1 || len(back) != 1 || back[0].Attrs["waited"] != "3" || gone[0].Level != slog.LevelWarn {
		t.Fatalf("outage lines %+v and %+v; want one Warn and one line with waited=3", gone, back)
	}
}

// Only a result the database gave, from a round begun after the outage
// began, ends it: not a round that started before, not a shutdown.
func TestOutageEndsWithTheDatabasesAnswer(t *testing.T) {
	t.Parallel()
	var logs testenv.Logs
	k := New(Config{Retry: fastRetry, Logger: logs.Logger()})
	msgs := group("a")
	before := time.Now()
	k.Plan(time.Now(), msgs, []consumer.Result{down})
	k.Plan(before, msgs, []consumer.Result{applied})                   // began before the outage
	k.Plan(time.Now(), msgs, []consumer.Result{stopped})               // a shutdown
	k.Plan(time.Now(), group("b", "c"), []consumer.Result{down, down}) // still down
	if back := logs.Records("idemq: database available again"); len(back) != 0 {
		t.Fatalf("the outage ended without the database's answer: %+v", back)
	}
	k.Plan(time.Now(), msgs, []consumer.Result{leased})
	back := logs.Records("idemq: database available again")
	if gone := logs.Records("idemq: database unavailable"); len(gone) != 1 || len(back) != 1 || back[0].Attrs["waited"] != "3" {
		t.Fatalf("outage lines %+v and %+v; want one each, waited=3", gone, back)
	}
}

// Waits without a RetryAfter come from the backoff: jittered, capped by
// Retry.MaxDelay; a RetryAfter is kept as it is.
func TestPlanDelays(t *testing.T) {
	t.Parallel()
	k := New(Config{Retry: idemq.Retry{BaseDelay: time.Millisecond, MaxDelay: 8 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler)})
	msgs := group("a")
	distinct := map[time.Duration]bool{}
	for range 200 {
		p := k.Plan(time.Now(), msgs, []consumer.Result{down})
		if p.Delay < 0 || p.Delay > 8*time.Millisecond {
			t.Fatalf("backoff delay %v outside [0, MaxDelay]", p.Delay)
		}
		distinct[p.Delay] = true
	}
	if len(distinct) < 2 {
		t.Fatalf("200 backoff delays took %d values: no jitter", len(distinct))
	}
	if p := k.Plan(time.Now(), msgs, []consumer.Result{leased}); p.Delay != leased.RetryAfter {
		t.Fatalf("delay %v for a key leased elsewhere, want its RetryAfter %v", p.Delay, leased.RetryAfter)
	}
}

// A handler failure held by a client that cannot hand one message back is
// one more delivery of that message, not of those behind it.
func TestGroupCountsDeliveriesOfRetriedMessages(t *testing.T) {
	t.Parallel()
	k := New(Config{Retry: fastRetry, Logger: slog.New(slog.DiscardHandler)})
	var seen [][]string
	fail := failed
	fail.RetryAfter = time.Millisecond
	rounds := []map[string]consumer.Result{{"a": fail, "b": untouched}, {"a": fail, "b": untouched}}
	msgs := group("a", "b")
	c := &client{}
	ctx := context.Background()
	if err := k.Group(ctx, ctx, msgs, script(rounds, &seen), c); err != nil {
		t.Fatal(err)
	}
	if msgs[0].Delivery != 3 || msgs[1].Delivery != 1 || !slices.Equal(c.settled, []string{"a", "b"}) {
		t.Fatalf("deliveries %d, %d, settled %v; want 3, 1 and a, b", msgs[0].Delivery, msgs[1].Delivery, c.settled)
	}
}

// A dead letter whose copy is refused holds with the messages behind it;
// the ones before it settle, and it is published again before its
// successors settle.
func TestGroupHoldsAtAFailedDeadLetter(t *testing.T) {
	t.Parallel()
	k := New(Config{Retry: fastRetry, Logger: slog.New(slog.DiscardHandler)})
	var seen [][]string
	rounds := []map[string]consumer.Result{{"b": dead, "c": dead}, {"b": dead, "c": dead}, {"c": dead}}
	c := &client{refuse: map[string]int{"b": 1, "c": 1}}
	ctx := context.Background()
	if err := k.Group(ctx, ctx, group("a", "b", "c", "d"), script(rounds, &seen), c); err != nil {
		t.Fatal(err)
	}
	// Round 1: b's copy refused (a settles); round 2: b published, c's
	// refused (b settles); round 3: c published, d applied.
	want := [][]string{{"a", "b", "c", "d"}, {"b", "c", "d"}, {"c", "d"}}
	if !slices.EqualFunc(seen, want, slices.Equal) || !slices.Equal(c.settled, []string{"a", "b", "c", "d"}) || !slices.Equal(c.published, []string{"b", "c"}) {
		t.Fatalf("rounds %v, settled %v, published %v", seen, c.settled, c.published)
	}
	if !slices.Equal(c.steps, []Action{Ack, DeadLetter, DeadLetter, Ack}) {
		t.Fatalf("steps %v", c.steps)
	}
}

// A stop while messages are held hands them back and returns the wait's
// error; a crash point's veto stops the group at once.
func TestGroupStops(t *testing.T) {
	t.Parallel()
	k := New(Config{Retry: idemq.Retry{BaseDelay: time.Hour, MaxDelay: time.Hour}, Logger: slog.New(slog.DiscardHandler)})
	var seen [][]string
	rounds := []map[string]consumer.Result{{"b": down}}
	c := &client{}
	wait, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	err := k.Group(wait, context.Background(), group("a", "b", "c"), script(rounds, &seen), c)
	if !errors.Is(err, context.Canceled) || !slices.Equal(c.settled, []string{"a"}) || !slices.Equal(c.released, []string{"b", "c"}) {
		t.Fatalf("stop: err %v, settled %v, released %v; want context.Canceled, a, then b and c handed back", err, c.settled, c.released)
	}

	veto := errors.New("crash")
	seen = nil
	c = &client{veto: veto}
	if err := k.Group(context.Background(), context.Background(), group("a", "b"), script(nil, &seen), c); !errors.Is(err, veto) || len(seen) != 1 {
		t.Fatalf("veto: err %v after %d rounds; want the veto after one", err, len(seen))
	}
}

// The per-message Processor stops at the first message the plan holds and
// leaves the rest alone; where the client hands one message back, a
// handler failure does not stop it.
func TestProcessorStopsAtTheFirstHeld(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	fail := map[string]bool{"b": true}
	c, err := consumer.New(pool, "kernel", func(ctx context.Context, _ pgx.Tx, m *consumer.Message) error {
		if fail[m.ID] {
			return fmt.Errorf("handler refuses %s", m.ID)
		}
		return nil
	}, consumer.Config{Redeliver: true, Retry: idemq.Retry{MaxAttempts: 5}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, redeliver := range []bool{false, true} {
		k := New(Config{Retry: fastRetry, Redeliver: redeliver, Logger: slog.New(slog.DiscardHandler)})
		msgs := group(fmt.Sprint("a", redeliver), "b", fmt.Sprint("c", redeliver))
		for _, m := range msgs {
			m.Payload = []byte(m.ID)
		}
		results := k.Processor(c, false)(ctx, msgs)
		var got []string
		for _, r := range results {
			got = append(got, r.Outcome.String()+map[bool]string{true: "(left alone)"}[notAttempted(r)])
		}
		want := "applied retry retry(left alone)"
		if redeliver {
			want = "applied retry applied"
		}
		if strings.Join(got, " ") != want {
			t.Fatalf("redeliver %v: results %v, want %s", redeliver, got, want)
		}
	}
}
