package franz_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// A relay publishes a batch that spans two destinations behind a Router
// (a transaction per destination and partition) and dies before its
// delete commits; the next relay, in a new "process" (a new TxSink with
// the same transactional ids), finds every row of that batch in the
// partitions' watermarks, also those of the first destination's
// transactions, and deletes them unpublished: a read_committed reader
// sees each message once.
func TestTxSinkRelayCrashAcrossDestinations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := testenv.Kafka(t, 2, "orders", "payments")
	topics := []string{k.Topic("orders"), k.Topic("payments")}
	pool, ob := newOutbox(t, ctx, testenv.PostgresURL(t))
	const n = 200
	// Each key has messages on both destinations, so a partition's rows
	// of the batch go out in two transactions.
	msgs := make([]outbox.Message, n)
	next := map[string]int{}
	for i := range msgs {
		key, dest := i%10, (i/10)%2
		order := fmt.Sprintf("key-%d@%d", key, dest) // the order a reader of one topic sees
		msgs[i] = outbox.Message{Destination: topics[dest], Key: fmt.Sprint("key-", key), Payload: fmt.Appendf(nil, "%s/%d", order, next[order])}
		next[order]++
	}
	if err := ob.Enqueue(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	cfg := franz.TxConfig{Outbox: "idemq-test", TransactionalIDPrefix: "crash-" + fmt.Sprint(time.Now().UnixNano()) + "-", WatermarkTopic: "idemq-watermarks-" + fmt.Sprint(time.Now().UnixNano())}
	routed := func(s relay.Sink) *relay.Router {
		r := relay.NewRouter()
		for _, topic := range topics {
			if err := r.Route(topic, s); err != nil {
				t.Fatal(err)
			}
		}
		return r
	}
	rcfg := relay.Config{BatchSize: n, LeaseTTL: 3 * time.Second, PollInterval: 10 * time.Millisecond, ShutdownGrace: 10 * time.Millisecond, Logger: quiet()}

	first, err := franz.NewTxSink(cfg, kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	published := make(chan int, 1)
	router := routed(first)
	crashing := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
		if err := router.Publish(ctx, id, batch); err != nil {
			return err
		}
		select {
		case published <- len(batch):
		default:
		}
		<-ctx.Done() // killed before the delete commits
		return ctx.Err()
	})
	r1, err := relay.New(pool, ob, crashing, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	run1, err := idemq.Start(ctx, r1)
	if err != nil {
		t.Fatal(err)
	}
	if sent := <-published; sent != n {
		t.Fatalf("the first relay's batch held %d messages, want all %d", sent, n)
	}
	_ = run1.Stop()
	first.Close()

	second := newTxSink(t, k, cfg)
	r2, err := relay.New(pool, ob, routed(second), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	run2, err := idemq.Start(ctx, r2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = run2.Stop() }()
	for {
		s, err := ob.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending == 0 {
			break
		}
		if err := lifecycle.Sleep(ctx, 20*time.Millisecond); err != nil {
			t.Fatal("the outbox never drained")
		}
	}
	records := readAllCommitted(t, ctx, k, topics)
	if dups := checkExactlyOnce(t, records, n); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
}
