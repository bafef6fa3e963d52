package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	idemqkafka "github.com/idemq/idemq/transports/kafka"
	"github.com/segmentio/kafka-go"
)

func outboxMessages(n int, destination string) []relay.Message {
	msgs := make([]relay.Message, n)
	for i := range msgs {
		msgs[i] = relay.Message{Message: outbox.Message{
			ID:          uuid.Must(uuid.NewV7()),
			Destination: destination,
			Key:         fmt.Sprintf("order-%d", i%7),
			Payload:     []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Headers:     map[string]string{"traceparent": "00-abc-def-01", "seq": fmt.Sprint(i)},
		}}
	}
	return msgs
}

func newSink(t *testing.T, k *testenv.KafkaCluster) *idemqkafka.Sink {
	t.Helper()
	w := idemqkafka.NewWriter(k.Brokers...)
	t.Cleanup(func() { w.Close() })
	s, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func header(m kafka.Message, name string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

func TestSinkPublishesBatchWithIDKeyAndHeaders(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, 3, "orders", "audit")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newSink(t, k)

	batch := append(outboxMessages(60, k.Topic("orders")), outboxMessages(10, k.Topic("audit"))...)
	if err := s.Publish(ctx, 0, batch); err != nil {
		t.Fatalf("Publish: %v", err)
	}

	byID := make(map[string]relay.Message)
	for _, m := range batch {
		byID[m.ID.String()] = m
	}
	for _, topic := range []string{k.Topic("orders"), k.Topic("audit")} {
		got, err := k.ReadAll(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		partitionOfKey := make(map[string]int)
		lastSeq := make(map[string]int)
		for _, m := range got {
			id, ok := header(m, idemqkafka.IDHeaderDefault)
			if !ok {
				t.Fatalf("message at %s/%d/%d has no id header", m.Topic, m.Partition, m.Offset)
			}
			want, ok := byID[id]
			if !ok {
				t.Fatalf("unknown id %s", id)
			}
			delete(byID, id)
			if string(m.Key) != want.Key || string(m.Value) != string(want.Payload) {
				t.Errorf("message %s: key %q value %q, want %q %q", id, m.Key, m.Value, want.Key, want.Payload)
			}
			if tp, _ := header(m, "traceparent"); tp != "00-abc-def-01" {
				t.Errorf("message %s: traceparent header %q not copied", id, tp)
			}
			if p, seen := partitionOfKey[want.Key]; seen && p != m.Partition {
				t.Errorf("key %s in partitions %d and %d", want.Key, p, m.Partition)
			}
			partitionOfKey[want.Key] = m.Partition
			var seq int
			fmt.Sscan(want.Headers["seq"], &seq)
			if prev, seen := lastSeq[want.Key]; seen && prev > seq {
				t.Errorf("key %s out of order: %d after %d", want.Key, seq, prev)
			}
			lastSeq[want.Key] = seq
		}
	}
	if len(byID) != 0 {
		t.Fatalf("%d messages not delivered", len(byID))
	}
}

func TestSinkIDHeaderOverridesOutboxHeader(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, 1, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newSink(t, k)
	m := outboxMessages(1, k.Topic("orders"))
	m[0].Headers[idemqkafka.IDHeaderDefault] = "forged"
	if err := s.Publish(ctx, 0, m); err != nil {
		t.Fatal(err)
	}
	got, err := k.ReadAll(ctx, k.Topic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, h := range got[0].Headers {
		if h.Key == idemqkafka.IDHeaderDefault {
			n++
			if string(h.Value) != m[0].ID.String() {
				t.Errorf("id header %q, want %s", h.Value, m[0].ID)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d id headers, want 1", n)
	}
}

func TestSinkClassifiesPerMessageFailures(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, 2, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := idemqkafka.NewWriter(k.Brokers...)
	w.BatchBytes = 64 << 10
	defer w.Close()
	s, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{
		Topic: func(d string) string {
			if d == "nowhere" {
				return ""
			}
			return d
		},
	})
	if err != nil {
		t.Fatal(err)
	}

	batch := outboxMessages(10, k.Topic("orders"))
	batch[2].Destination = "no-such-topic-" + uuid.NewString()
	batch[5].Payload = []byte(strings.Repeat("x", 100<<10))
	batch[7].Destination = "nowhere"

	err = s.Publish(ctx, 0, batch)
	var perr *relay.PublishError
	if !errors.As(err, &perr) {
		t.Fatalf("Publish: %v, want *relay.PublishError", err)
	}
	for _, i := range []int{2, 5, 7} {
		if e, ok := perr.Failed[i]; !ok || !idemq.IsPermanent(e) {
			t.Errorf("message %d: error %v, want a permanent one", i, e)
		}
	}
	if !errors.Is(perr.Failed[5], kafka.MessageSizeTooLarge) {
		t.Errorf("message 5: %v, want MessageSizeTooLarge", perr.Failed[5])
	}
	if !errors.Is(perr.Failed[2], kafka.UnknownTopicOrPartition) {
		t.Errorf("message 2: %v, want UnknownTopicOrPartition", perr.Failed[2])
	}
	// Message 9 has message 2's key: held back behind it, not attempted.
	if !errors.Is(perr.Failed[9], relay.ErrSkipped) || idemq.IsPermanent(perr.Failed[9]) {
		t.Errorf("message 9: %v, want relay.ErrSkipped", perr.Failed[9])
	}
	if len(perr.Failed) != 4 {
		t.Errorf("failed %v, want only 2, 5, 7 and 9", perr.Failed)
	}
	got, err := k.ReadAll(ctx, k.Topic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 6 {
		t.Fatalf("%d messages delivered, want 6", len(got))
	}
}

func TestSinkBrokerDownIsRetryable(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, 1, "orders")
	if k.External() {
		t.Skip("needs the in-process broker to stop it; " + testenv.KafkaBrokersEnv + " is set")
	}
	s := newSink(t, k)
	ctx0, cancel0 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel0()
	if err := s.Publish(ctx0, 0, outboxMessages(3, k.Topic("orders"))); err != nil {
		t.Fatal(err)
	}
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.Publish(ctx, 0, outboxMessages(3, k.Topic("orders")))
	if err == nil {
		t.Fatal("Publish to a stopped broker succeeded")
	}
	var perr *relay.PublishError
	if errors.As(err, &perr) {
		for i, e := range perr.Failed {
			if idemq.IsPermanent(e) {
				t.Errorf("message %d: %v is permanent, want retryable", i, e)
			}
		}
	} else if idemq.IsPermanent(err) {
		t.Errorf("%v is permanent, want retryable", err)
	}
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	// The relay retries a failed batch; so does the test, until the
	// writer's connections recover (or the minute runs out).
	for {
		err := s.Publish(ctx2, 0, outboxMessages(3, k.Topic("orders")))
		if err == nil {
			break
		}
		if ctx2.Err() != nil {
			t.Fatalf("Publish after the broker came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestNewSinkRejectsUnsafeWriters(t *testing.T) {
	t.Parallel()
	good := func() *kafka.Writer { return idemqkafka.NewWriter("127.0.0.1:9") }
	for name, mutate := range map[string]func(*kafka.Writer){
		"async":       func(w *kafka.Writer) { w.Async = true },
		"topic":       func(w *kafka.Writer) { w.Topic = "t" },
		"no acks":     func(w *kafka.Writer) { w.RequiredAcks = kafka.RequireNone },
		"round robin": func(w *kafka.Writer) { w.Balancer = nil },
		"no addr":     func(w *kafka.Writer) { w.Addr = nil },
	} {
		w := good()
		mutate(w)
		if _, err := idemqkafka.NewSink(w, idemqkafka.SinkConfig{}); !errors.Is(err, idemq.ErrConfig) {
			t.Errorf("%s: NewSink error %v, want idemq.ErrConfig", name, err)
		}
	}
	if _, err := idemqkafka.NewSink(good(), idemqkafka.SinkConfig{}); err != nil {
		t.Errorf("NewWriter's writer rejected: %v", err)
	}
}

func TestSinkKeepsKeyOrderAcrossTopics(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t, 2, "a", "b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newSink(t, k)
	msg := func(dest, key, payload string) relay.Message {
		return relay.Message{Message: outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: dest, Key: key, Payload: []byte(payload)}}
	}
	batch := []relay.Message{
		msg(k.Topic("a"), "k1", "k1-1"),
		msg(k.Topic("b"), "k1", "k1-2"), // a second round, after k1-1 is written
		msg(k.Topic("a"), "k1", "k1-3"), // a third
		msg(k.Topic("a"), "k2", "k2-1"),
		msg("missing-"+uuid.NewString(), "k2", "k2-2"), // fails permanently
		msg(k.Topic("a"), "k2", "k2-3"),                // must not overtake it
		msg(k.Topic("b"), "", "unkeyed"),
	}
	err := s.Publish(ctx, 0, batch)
	var perr *relay.PublishError
	if !errors.As(err, &perr) {
		t.Fatalf("Publish: %v, want *relay.PublishError", err)
	}
	if len(perr.Failed) != 2 || !idemq.IsPermanent(perr.Failed[4]) || !errors.Is(perr.Failed[5], relay.ErrSkipped) {
		t.Fatalf("failed %v, want 4 permanent and 5 skipped", perr.Failed)
	}
	var payloads []string
	for _, topic := range []string{k.Topic("a"), k.Topic("b")} {
		got, err := k.ReadAll(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range got {
			payloads = append(payloads, string(m.Value))
		}
	}
	slices.Sort(payloads)
	if want := []string{"k1-1", "k1-2", "k1-3", "k2-1", "unkeyed"}; !slices.Equal(payloads, want) {
		t.Errorf("delivered %v, want %v", payloads, want)
	}
}
