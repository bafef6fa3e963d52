package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestKafkaProducesAndFetches(t *testing.T) {
	k := Kafka(t, 3, "orders")
	topic := k.Topic("orders")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var msgs []kafka.Message
	for i := range 30 {
		msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte(fmt.Sprint("k", i%5)), Value: []byte(fmt.Sprint(i))})
	}
	if err := k.Produce(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if got := readAll(ctx, t, k, topic); got != len(msgs) {
		t.Fatalf("read %d messages, want %d", got, len(msgs))
	}
}

func TestKafkaTopicsAreIsolatedPerCluster(t *testing.T) {
	a, b := Kafka(t, 1, "orders"), Kafka(t, 1, "orders")
	if a.Topic("orders") == b.Topic("orders") {
		t.Fatalf("two clusters share topic %s", a.Topic("orders"))
	}
	if a.Group("g") == b.Group("g") {
		t.Fatalf("two clusters share group %s", a.Group("g"))
	}
}

func TestKafkaRestartKeepsMessages(t *testing.T) {
	k := Kafka(t, 1, "orders")
	if k.External() {
		t.Skip("Restart needs the in-process broker; " + KafkaBrokersEnv + " is set")
	}
	topic := k.Topic("orders")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.Produce(ctx, kafka.Message{Topic: topic, Value: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, kafka.Message{Topic: topic, Value: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	if got := readAll(ctx, t, k, topic); got != 2 {
		t.Fatalf("read %d messages after restart, want 2", got)
	}
}

// readAll counts the messages of every partition of topic up to its end.
func readAll(ctx context.Context, t *testing.T, k *KafkaCluster, topic string) int {
	t.Helper()
	n := 0
	for p := range k.Partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", k.Brokers[0], topic, p)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		if last == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: topic, Partition: p, MaxWait: 50 * time.Millisecond})
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			n++
			if m.Offset == last-1 {
				break
			}
		}
		r.Close()
	}
	return n
}
