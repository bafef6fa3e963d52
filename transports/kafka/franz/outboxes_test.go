package franz_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/lifecycle"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
	"github.com/idemq/idemq/transports/kafka/franz"
)

// syncLog is a log the relay writes and the test reads.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

// Two outboxes (two tables, each with its own seqs from 1) publish into one
// Kafka cluster through TxSinks given the same TransactionalIDPrefix and
// WatermarkTopic, as two deployments at the binary's fixed defaults did.
// Outbox B drains first; its watermarks, keyed by transactional id, name
// seqs that outbox A's rows also carry. A's relay must not take B's
// watermark for its own: every row of A ends up published or still in
// its outbox, none deleted unpublished; A's relay refuses the foreign
// watermark and says why, as the Sink's failure, not the database's.
func TestTxSinkTwoOutboxesOnOneClusterDeleteNothingUnpublished(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k := testenv.Kafka(t, 1, "orders")
	topic := k.Topic("orders")
	pool, err := pgxpool.New(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	open := func(table string) *outbox.Outbox {
		ob, err := outbox.New(pool, outbox.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return ob
	}
	obA, obB := open("outbox_a"), open("outbox_b")
	const n = 20
	for name, ob := range map[string]*outbox.Outbox{"A": obA, "B": obB} {
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Destination: topic, Key: fmt.Sprint("key-", i%5), Payload: fmt.Appendf(nil, "%s/%d", name, i)}
		}
		if err := ob.Enqueue(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	shared := fmt.Sprint(time.Now().UnixNano())
	sinkFor := func(ob *outbox.Outbox) *franz.TxSink {
		name, err := relay.OutboxName(ctx, pool, ob)
		if err != nil {
			t.Fatal(err)
		}
		return newTxSink(t, k, franz.TxConfig{
			Outbox:                name,
			TransactionalIDPrefix: "same-" + shared + "-",
			WatermarkTopic:        "same-watermarks-" + shared,
		})
	}
	pending := func(ob *outbox.Outbox) int64 {
		s, err := ob.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s.Pending
	}
	rcfg := relay.Config{LeaseTTL: time.Second, PollInterval: 10 * time.Millisecond, Logger: quiet()}

	// B drains.
	rb, err := relay.New(pool, obB, sinkFor(obB), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	runB, err := idemq.Start(ctx, rb)
	if err != nil {
		t.Fatal(err)
	}
	for pending(obB) > 0 {
		if err := lifecycle.Sleep(ctx, 20*time.Millisecond); err != nil {
			t.Fatal("outbox B never drained")
		}
	}
	_ = runB.Stop()

	// A starts on the same names.
	var log syncLog
	rcfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	ra, err := relay.New(pool, obA, sinkFor(obA), rcfg)
	if err != nil {
		t.Fatal(err)
	}
	runA, err := idemq.Start(ctx, ra)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = runA.Stop() }()
	const refused = "belongs to another outbox"
	for pending(obA) > 0 && !log.contains(refused) {
		if err := lifecycle.Sleep(ctx, 20*time.Millisecond); err != nil {
			t.Fatal("outbox A neither drained nor refused B's watermarks")
		}
	}
	_ = runA.Stop()
	published := 0
	for _, r := range readAllCommitted(t, ctx, k, []string{topic}) {
		if bytes.HasPrefix(r.Value, []byte("A/")) {
			published++
		}
	}
	left := pending(obA)
	if published+int(left) != n {
		t.Fatalf("outbox A: %d of %d messages published, %d left in the outbox: %d rows deleted unpublished", published, n, left, n-published-int(left))
	}
	if !log.contains(refused) {
		t.Errorf("outbox A's relay did not say that B's watermark belongs to another outbox")
	}
	// The Sink's refusal is not a database outage.
	if !log.contains("the Sink cannot give a partition's watermark") || log.contains("database unavailable") {
		t.Errorf("outbox A's relay logged the refused watermark as a database outage, or not as the Sink's")
	}
}
