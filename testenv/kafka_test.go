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

// readAll counts the messages in topic.
func readAll(ctx context.Context, t *testing.T, k *KafkaCluster, topic string) int {
	t.Helper()
	msgs, err := k.ReadAll(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	return len(msgs)
}
