package idemwatermill_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemwatermill"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// features are what the adapter guarantees, for Watermill's universal
// suite. ConsumerGroups: no, every Subscriber of an outbox shares its
// messages. ExactlyOnceDelivery: no, a process that dies between an Ack and
// the row's delete delivers the message again (the Middleware applies it
// once; see TestMiddleware...). GuaranteedOrder: yes, per ordering key (the
// topic by default), with any number of subscribers, since the relay hands
// a key's next message out only after the previous one was acked.
// Persistent: yes, messages wait in Postgres for a subscriber.
// NewSubscriberReceivesOldMessages: no, an acked message is deleted.
func features(short bool) tests.Features {
	return tests.Features{
		GuaranteedOrder: true,
		Persistent:      true,
		ForceShort:      short,
	}
}

// suite is one run of Watermill's suite on one database: every test
// function of the suite gets an outbox table of its own, shared by the
// publishers and subscribers it makes, as the Subscribers of one service
// share one outbox.
type suite struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	obs  map[string]*outbox.Outbox
}

func newSuite(t *testing.T) *suite {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// A relay keeps a connection while a subscription holds a message.
	cfg.MaxConns = 100
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &suite{pool: pool, obs: map[string]*outbox.Outbox{}}
}

// outbox returns the outbox of the suite's test function running as t.
func (s *suite) outbox(t *testing.T) *outbox.Outbox {
	table := fmt.Sprintf("wm_%x", sha256.Sum256([]byte(t.Name())))[:19]
	s.mu.Lock()
	defer s.mu.Unlock()
	if ob := s.obs[table]; ob != nil {
		return ob
	}
	ob, err := outbox.New(s.pool, outbox.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.obs[table] = ob
	return ob
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func (s *suite) pubSub(t *testing.T) (message.Publisher, message.Subscriber) {
	ob := s.outbox(t)
	pub, err := idemwatermill.NewPublisher(s.pool, ob, idemwatermill.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := idemwatermill.NewSubscriber(s.pool, ob, idemwatermill.SubscriberConfig{Relay: relay.Config{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	return pub, sub
}

// TestPubSub runs Watermill's universal Pub/Sub suite (pubsub/tests) on
// the adapter, in its short form; make soak runs the full one
// (TestPubSubStress).
func TestPubSub(t *testing.T) {
	s := newSuite(t)
	tests.TestPubSub(t, features(true), s.pubSub, nil)
}

// stressEnv sets the number of parallel runs of TestPubSubStress, at full
// size; unset, it runs the short suite twice at once.
const stressEnv = "IDEMQ_WATERMILL_STRESS"

// TestPubSubStress runs Watermill's suite several times in parallel on one
// database, as Watermill's TestPubSubStressTest does (which takes its count
// from STRESS_TEST_COUNT): make soak sets IDEMQ_WATERMILL_STRESS.
func TestPubSubStress(t *testing.T) {
	runs, short := 2, true
	if v := os.Getenv(stressEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a number of runs", stressEnv, v)
		}
		runs, short = n, false
	}
	s := newSuite(t)
	for i := range runs {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			tests.TestPubSub(t, features(short), s.pubSub, nil)
		})
	}
}
