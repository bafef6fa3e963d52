package franz_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// keyed returns n messages of outbox partition part under lease token,
// with seqs from seq on.
func keyed(topic string, part int, token, seq int64, n int) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		out[i] = relay.Message{
			Message:    outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: topic, Key: fmt.Sprint("k", i%3), Payload: fmt.Appendf(nil, "%d/%d", token, seq+int64(i))},
			Seq:        seq + int64(i),
			Partition:  part,
			LeaseToken: token,
		}
	}
	return out
}

// A new owner's Watermark returns what the previous owner's last
// transaction committed, and the previous owner's producer, fenced, cannot
// publish under its old token any more.
func TestTxSinkWatermark(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.Kafka(t, 2, "orders")
	old := newTxSink(t, k, franz.TxConfig{})
	if wm, err := old.Watermark(ctx, 3, 1); err != nil || len(wm.Seqs) != 0 {
		t.Fatalf("first Watermark: %+v, %v; want none", wm, err)
	}
	for _, seq := range []int64{1, 11} {
		if err := old.Publish(ctx, 0, keyed(k.Topic("orders"), 3, 1, seq, 10)); err != nil {
			t.Fatal(err)
		}
	}
	next, err := franz.NewTxSink(franz.TxConfig{Outbox: "idemq-test", TransactionalIDPrefix: old.TransactionalID(3)[:len(old.TransactionalID(3))-1], WatermarkTopic: old.WatermarkTopic()}, kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	wm, err := next.Watermark(ctx, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}; wm.Token != 1 || wm.Seq != 20 || !slices.Equal(wm.Seqs, want) {
		t.Fatalf("watermark %+v, want token 1, seq 20, seqs %v", wm, want)
	}
	// The old owner publishes again under its old token: fenced.
	err = old.Publish(ctx, 0, keyed(k.Topic("orders"), 3, 1, 21, 2))
	var pe *relay.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 2 || !errors.Is(pe.Failed[0], franz.ErrFenced) {
		t.Fatalf("old owner's publish: %v, want both messages failed with ErrFenced", err)
	}
	got, err := readCommitted(ctx, k, k.Topic("orders"))
	if err != nil || len(got) != 20 {
		t.Fatalf("read %d committed records (%v), want 20", len(got), err)
	}
}

// The zombie: an old owner has an open transaction when the partition's
// lease moves; the new owner's InitProducerID (its Watermark call) aborts
// it, the old owner's commit is refused by Kafka, and nothing of it is
// visible to read_committed consumers, though its records were written.
func TestTxSinkZombieFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.Kafka(t, 2, "orders")
	prefix := "zombie-" + uuid.NewString()[:8] + "-"
	reached, release := make(chan struct{}), make(chan struct{})
	zombie := newTxSink(t, k, franz.TxConfig{TransactionalIDPrefix: prefix, Test: franz.TxTestConfig{
		BeforeCommit: func(ctx context.Context, partition int, token int64) error {
			close(reached)
			<-release
			return nil
		},
	}})
	owner := newTxSink(t, k, franz.TxConfig{TransactionalIDPrefix: prefix})
	topic := k.Topic("orders")

	zerr := make(chan error, 1)
	go func() { zerr <- zombie.Publish(ctx, 0, keyed(topic, 5, 1, 1, 10)) }()
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the zombie never reached its commit")
	}
	// The lease moves: the new owner fences the zombie and publishes.
	wm, err := owner.Watermark(ctx, 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(wm.Seqs) != 0 {
		t.Fatalf("watermark %+v: the zombie's open transaction is in it", wm)
	}
	if err := owner.Publish(ctx, 0, keyed(topic, 5, 2, 1, 10)); err != nil {
		t.Fatalf("new owner: %v", err)
	}
	close(release)
	err = <-zerr
	var pe *relay.PublishError
	if !errors.As(err, &pe) || len(pe.Failed) != 10 {
		t.Fatalf("zombie's publish: %v, want all 10 messages failed", err)
	}
	for i, e := range pe.Failed {
		if !errors.Is(e, franz.ErrFenced) {
			t.Fatalf("zombie's message %d: %v, want ErrFenced", i, e)
		}
	}
	t.Logf("the zombie's commit: %v", pe.Failed[0])

	got, err := readCommitted(ctx, k, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if r.Value[0] != '2' {
			t.Fatalf("read_committed consumer saw the zombie's record %q", r.Value)
		}
	}
	if len(got) != 10 {
		t.Fatalf("read_committed consumer saw %d records, want the new owner's 10", len(got))
	}
	// The zombie's records are in the log, aborted.
	all, err := readTopic(ctx, k, topic, kgo.ReadUncommitted())
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 20 {
		t.Fatalf("read_uncommitted consumer saw %d records, want 20 (10 aborted)", len(all))
	}
}

// A TxSink that is handed rows its partition's last committed watermark
// names (a relay that did not delete them first: a Sink wrapper that hides
// the Watermarker) reports them delivered without sending them again.
func TestTxSinkSkipsWhatItsWatermarkNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.Kafka(t, 2, "orders")
	first := newTxSink(t, k, franz.TxConfig{})
	batch := keyed(k.Topic("orders"), 9, 1, 1, 5)
	if err := first.Publish(ctx, 0, batch); err != nil {
		t.Fatal(err)
	}
	prefix := first.TransactionalID(9)[:len(first.TransactionalID(9))-1]
	next := newTxSink(t, k, franz.TxConfig{TransactionalIDPrefix: prefix, WatermarkTopic: first.WatermarkTopic()})
	again := keyed(k.Topic("orders"), 9, 2, 1, 6) // seqs 1-5 again, and 6
	for i := range 5 {
		again[i].Message = batch[i].Message
	}
	if err := next.Publish(ctx, 0, again); err != nil {
		t.Fatal(err)
	}
	got, err := readCommitted(ctx, k, k.Topic("orders"))
	if err != nil || len(got) != 6 {
		t.Fatalf("read %d committed records (%v), want the 5 of the first sink and 1 more", len(got), err)
	}
}

// A Publish whose context ends while its transaction is being produced
// returns at once, and the transaction is all or nothing for a
// read_committed reader.
func TestTxSinkCancelledMidTransaction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k := testenv.Kafka(t, 2, "orders")
	s := newTxSink(t, k, franz.TxConfig{})
	if _, err := s.Watermark(ctx, 4, 1); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		pctx, stop := context.WithCancel(ctx)
		time.AfterFunc(time.Duration(round)*time.Millisecond, stop)
		start := time.Now()
		err := s.Publish(pctx, 0, keyed(k.Topic("orders"), 4, 1, int64(1+round*2000), 2000))
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("round %d: Publish took %v after its context ended", round, took)
		}
		stop()
		t.Logf("round %d: %v", round, err != nil)
	}
	got, err := readCommitted(ctx, k, k.Topic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got)%2000 != 0 {
		t.Fatalf("%d committed records: a transaction was cut", len(got))
	}
	// The sink still works.
	if err := s.Publish(ctx, 0, keyed(k.Topic("orders"), 4, 1, 20001, 10)); err != nil {
		t.Fatalf("after the cancellations: %v", err)
	}
}
