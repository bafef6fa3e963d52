package relay_test

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// count counts the deliveries whose payload starts with prefix.
func count(rec *recorder, prefix string) int {
	n := 0
	for _, m := range rec.deliveries() {
		if strings.HasPrefix(string(m.Payload), prefix) {
			n++
		}
	}
	return n
}

// TestLockedRowBlocksItsKey: a row of key k that another session holds
// locked (an operator's SELECT ... FOR UPDATE or UPDATE, left open) is not
// lockable by the relay, but it is still k's head: k's later rows wait
// until the lock goes, while every other key and the unkeyed rows go on.
// Then k is published in order, the locked row first.
func TestLockedRowBlocksItsKey(t *testing.T) {
	for _, lock := range []string{
		`SELECT 1 FROM %s WHERE payload = 'k:0' FOR UPDATE`,
		`UPDATE %s SET last_error = 'looked at by an operator' WHERE payload = 'k:0'`,
	} {
		t.Run(strings.Fields(lock)[0], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var msgs []outbox.Message
			for i := range 5 {
				msgs = append(msgs, outbox.Message{Destination: "d", Key: "k", Payload: fmt.Appendf(nil, "k:%d", i)})
				for j := range 10 {
					msgs = append(msgs, outbox.Message{Destination: "d", Key: fmt.Sprint("o", j), Payload: fmt.Appendf(nil, "o%d:%d", j, i)},
						outbox.Message{Destination: "d", Payload: fmt.Appendf(nil, "free-%d-%d", i, j)})
				}
			}
			enqueue(t, b, msgs...)
			op, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer op.Rollback(b.ctx)
			if _, err := op.Exec(b.ctx, fmt.Sprintf(lock, b.table())); err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			run(t, newRelay(t, b, rec, relay.Config{BatchSize: 7, DisableListen: true, PollInterval: 20 * time.Millisecond}))
			idemqtest.WaitFor(t, "the other keys and the unkeyed rows", func() bool { return count(rec, "o") == 50 && count(rec, "free") == 50 })
			if n := count(rec, "k:"); n != 0 {
				t.Fatalf("%d rows of k delivered while its head k:0 is locked by another session", n)
			}
			if err := op.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			idemqtest.WaitFor(t, "k once the lock is gone", func() bool { return count(rec, "k:") == 5 })
			checkOrder(t, rec.deliveries())
		})
	}
}

// TestNotDueRowsDoNotStallTheOutbox: while a writer transaction stays open
// (the horizon cannot pass its seq), a window full of rows that are not
// due (a retry's backoff) or wait behind such a row of their key does not
// stop the due rows of other keys after them, with one worker (one cursor
// over the whole outbox) or two (a cursor per partition).
func TestNotDueRowsDoNotStallTheOutbox(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprint("workers=", workers), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			writer, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer writer.Rollback(b.ctx)
			if err := b.ob.EnqueueTx(b.ctx, writer, outbox.Message{Destination: "d", Key: "w", Payload: []byte("w:0")}); err != nil {
				t.Fatal(err)
			}
			// Every key in one partition, the one of "stuck": a worker's
			// scan of it reads them in seq order.
			var msgs []outbox.Message
			for _, k := range samePartition(t, b, "stuck", "later", 30) {
				msgs = append(msgs, outbox.Message{Destination: "d", Key: k, Payload: []byte(k + ":0")})
			}
			for i := range 30 {
				msgs = append(msgs, outbox.Message{Destination: "d", Key: "stuck", Payload: fmt.Appendf(nil, "stuck:%d", i)})
			}
			for _, k := range samePartition(t, b, "stuck", "now", 30) {
				msgs = append(msgs, outbox.Message{Destination: "d", Key: k, Payload: []byte(k + ":0")})
			}
			enqueue(t, b, msgs...)
			if _, err := b.pool.Exec(b.ctx, `UPDATE `+b.table()+` SET available_at = now() + interval '1 hour'
WHERE key LIKE 'later%' OR payload = 'stuck:0'`); err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			run(t, newRelay(t, b, rec, relay.Config{BatchSize: 10, Workers: workers, DisableListen: true, PollInterval: 20 * time.Millisecond}))
			idemqtest.WaitFor(t, "the due rows behind 60 rows that are not due or blocked", func() bool { return count(rec, "now") == 30 })
			if n := count(rec, "stuck") + count(rec, "later"); n != 0 {
				t.Fatalf("%d rows that are not due, or blocked, delivered", n)
			}
			// More rows keep coming through while the writer is still open.
			enqueue(t, b, keyed("d", 40, 8, 0)...)
			idemqtest.WaitFor(t, "rows enqueued later", func() bool { return count(rec, "k") == 40 })
			if err := writer.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			idemqtest.WaitFor(t, "the writer's row", func() bool { return count(rec, "w:0") == 1 })
			checkOrder(t, rec.deliveries())
		})
	}
}

// samePartition returns n keys prefix0, prefix1, ... that hash to the
// relay partition of key.
func samePartition(t *testing.T, b bundle, key, prefix string, n int) []string {
	t.Helper()
	var keys []string
	err := b.pool.QueryRow(b.ctx, `SELECT array_agg(k) FROM (
  SELECT $2 || i AS k FROM generate_series(0, 100000) AS i
  WHERE mod(hashtext($2 || i)::int8 + 2147483648, 64) = mod(hashtext($1)::int8 + 2147483648, 64)
  LIMIT $3) AS s`, key, prefix, n).Scan(&keys)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestOpenDeadLetterTransactionsDoNotStopTheRelay: an operator's ReplayTx
// or PurgeTx left open (it holds the partitions of its keys) stops neither
// the relay nor any other key; the replayed message is published once the
// transaction commits, before the later messages of its key.
func TestOpenDeadLetterTransactionsDoNotStopTheRelay(t *testing.T) {
	for _, op := range []string{"replay", "purge"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var poison atomic.Bool
			poison.Store(true)
			rec := &recorder{fn: func(_ int, batch []relay.Message) error {
				f := relay.NewFailures(batch)
				for i, m := range batch {
					if !f.Skip(i) && poison.Load() && string(m.Payload) == "dead:0" {
						f.Fail(i, idemq.Permanent(errors.New("poison")))
					}
				}
				return f.Err(b.ctx)
			}}
			run(t, newRelay(t, b, rec, relay.Config{BatchSize: 10, ParkFollowers: true, DisableListen: true, PollInterval: 20 * time.Millisecond}))
			enqueue(t, b, outbox.Message{Destination: "d", Key: "dead", Payload: []byte("dead:0")})
			idemqtest.WaitFor(t, "a dead letter", func() bool {
				d, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
				return err == nil && len(d) == 1
			})
			poison.Store(false)
			enqueue(t, b, outbox.Message{Destination: "d", Key: "dead", Payload: []byte("dead:1")})
			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(b.ctx)
			settle := b.ob.ReplayTx
			if op == "purge" {
				settle = b.ob.PurgeTx
			}
			if n, err := settle(b.ctx, tx, outbox.DeadFilter{Key: "dead"}); err != nil || n != 1 {
				t.Fatalf("%s: %d, %v", op, n, err)
			}
			// Every key, including those in the dead key's partition.
			enqueue(t, b, keyed("d", 500, 200, 0)...)
			idemqtest.WaitFor(t, "every other key while the operator's transaction is open", func() bool { return count(rec, "k") == 500 })
			if n := count(rec, "dead:"); n != 0 {
				t.Fatalf("the parked key delivered %d rows before the operator committed", n)
			}
			if err := tx.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			want := "dead:0,dead:1"
			if op == "purge" {
				want = "dead:1"
			}
			idemqtest.WaitFor(t, want, func() bool {
				var got []string
				for _, m := range rec.deliveries() {
					if m.Key == "dead" {
						got = append(got, string(m.Payload))
					}
				}
				return strings.Join(got, ",") == want
			})
		})
	}
}

// TestKeyOrderIsPerDestination: a key whose head keeps failing on one
// destination holds back only that destination's later messages of the
// key; the key's messages to another destination go on. With
// GlobalKeyOrder they wait too.
func TestKeyOrderIsPerDestination(t *testing.T) {
	for _, global := range []bool{false, true} {
		t.Run(fmt.Sprint("global=", global), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var failing atomic.Bool
			failing.Store(true)
			rec := &recorder{fn: func(_ int, batch []relay.Message) error {
				f := relay.NewFailures(batch)
				for i, m := range batch {
					if !f.Skip(i) && failing.Load() && m.Destination == "a" {
						f.Fail(i, errors.New("a is down"))
					}
				}
				return f.Err(b.ctx)
			}}
			var msgs []outbox.Message
			for i := range 10 {
				for _, dest := range []string{"a", "b"} {
					msgs = append(msgs, outbox.Message{Destination: dest, Key: "k", Payload: fmt.Appendf(nil, "%s/k:%d", dest, i)})
				}
			}
			enqueue(t, b, msgs...)
			run(t, newRelay(t, b, rec, relay.Config{BatchSize: 4, GlobalKeyOrder: global, DisableListen: true, PollInterval: 20 * time.Millisecond,
				Retry: idemq.Retry{BaseDelay: 20 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 1000}}))
			if !global {
				idemqtest.WaitFor(t, "k's messages to b while a fails", func() bool { return count(rec, "b/") == 10 })
			} else {
				idemqtest.WaitFor(t, "a few failed attempts", func() bool {
					var attempts int
					err := b.pool.QueryRow(b.ctx, `SELECT attempts FROM `+b.table()+` WHERE payload = 'a/k:0'`).Scan(&attempts)
					return err == nil && attempts >= 3
				})
				if n := count(rec, "b/"); n != 0 {
					t.Fatalf("%d messages of k to b delivered while k's head to a fails", n)
				}
			}
			if n := count(rec, "a/"); n != 0 {
				t.Fatalf("%d messages to a delivered while it fails", n)
			}
			failing.Store(false)
			idemqtest.WaitFor(t, "everything", func() bool { return distinct(rec) == 20 })
			per := map[string][]relay.Message{}
			for _, m := range rec.deliveries() {
				per[m.Destination] = append(per[m.Destination], m)
			}
			for dest, ms := range per {
				for i := range ms {
					ms[i].Payload = []byte(strings.TrimPrefix(string(ms[i].Payload), dest+"/"))
				}
				checkOrder(t, ms)
			}
		})
	}
}
