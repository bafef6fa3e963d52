package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// TestLongRunningTransactionDoesNotStall keeps a transaction open for 10 s,
// with outbox rows of its own, while other transactions enqueue and the
// relay publishes: their rows are delivered while it is open (a writer
// waits for each of its messages before sending the next, so delivery must
// keep going for the loop to advance), and its own rows once it commits.
func TestLongRunningTransactionDoesNotStall(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{BatchSize: 100}))

	long, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(b.ctx)
	if err := b.ob.EnqueueTx(b.ctx, long, outbox.Message{Destination: "d", Key: "k0", Payload: []byte("long:0")},
		outbox.Message{Destination: "d", Payload: []byte("long-unkeyed")}); err != nil {
		t.Fatal(err)
	}

	sent, rounds := 0, 0
	for start := time.Now(); time.Since(start) < 10*time.Second; rounds++ {
		// 200 rows per round, so that dead rows pile up behind the
		// long transaction's horizon.
		msgs := keyed("d", 200, 50, sent)
		for i := range msgs {
			msgs[i].Key = "short-" + msgs[i].Key
			msgs[i].Payload = append([]byte("short-"), msgs[i].Payload...)
		}
		enqueue(t, b, msgs...)
		sent += len(msgs)
		idemqtest.WaitFor(t, fmt.Sprintf("round %d delivered while the long transaction is open", rounds), func() bool { return distinct(rec) == sent })
	}
	if rounds < 2 {
		t.Fatalf("only %d rounds", rounds)
	}
	for _, m := range rec.deliveries() {
		if string(m.Payload[:4]) == "long" {
			t.Fatalf("uncommitted row %s delivered", m.Payload)
		}
	}
	if err := long.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "the long transaction's rows", func() bool { return distinct(rec) == sent+2 })
	checkOrder(t, rec.deliveries())
	t.Logf("%d rounds of 200 messages delivered during the 10 s transaction", rounds)
}

// TestOutOfOrderCommits: a transaction that enqueues first and commits last
// loses nothing, even after the relay has moved well past its rows.
func TestOutOfOrderCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{BatchSize: 50, RescanInterval: time.Hour}))

	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(b.ctx)
	if err := b.ob.EnqueueTx(b.ctx, first,
		outbox.Message{Destination: "d", Key: "late", Payload: []byte("late:0")},
		outbox.Message{Destination: "d", Payload: []byte("late-unkeyed")}); err != nil {
		t.Fatal(err)
	}
	// A second transaction enqueues later rows of the same key and commits
	// first; then a busy stretch moves the relay's cursor past both.
	enqueue(t, b, outbox.Message{Destination: "d", Key: "late", Payload: []byte("late:1")})
	idemqtest.WaitFor(t, "the second transaction's row", func() bool { return distinct(rec) == 1 })
	var msgs []outbox.Message
	for i := range 2000 {
		msgs = append(msgs, outbox.Message{Destination: "d", Payload: fmt.Append(nil, i)})
	}
	enqueue(t, b, msgs...)
	idemqtest.WaitFor(t, "busy stretch", func() bool { return distinct(rec) == 2001 })
	if err := first.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	idemqtest.WaitFor(t, "the first transaction's rows", func() bool { return distinct(rec) == 2003 })
	// The recorder sees a batch before its commit deletes the rows.
	idemqtest.WaitFor(t, "an empty outbox", func() bool { return pending(t, b) == 0 })
}

// TestManyInterleavedTransactions commits transactions in an order unrelated
// to their enqueue order; every row is delivered.
func TestManyInterleavedTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	run(t, newRelay(t, b, rec, relay.Config{BatchSize: 20}))
	var open []pgx.Tx
	total := 0
	for i := range 40 {
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ob.EnqueueTx(b.ctx, tx, outbox.Message{Destination: "d", Key: fmt.Sprint("k", i%3), Payload: fmt.Append(nil, i)},
			outbox.Message{Destination: "d", Payload: fmt.Append(nil, i)}); err != nil {
			t.Fatal(err)
		}
		total += 2
		open = append(open, tx)
		if i%4 == 3 { // commit newest first
			for j := len(open) - 1; j >= 0; j-- {
				if err := open[j].Commit(b.ctx); err != nil {
					t.Fatal(err)
				}
			}
			open = open[:0]
		}
	}
	idemqtest.WaitFor(t, "all rows", func() bool { return distinct(rec) == total && pending(t, b) == 0 })
}
