package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
)

// runErr starts r and returns a function that waits (up to a minute) for
// Run to return by itself and returns its error.
func runErr(t *testing.T, r *relay.Relay) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			t.Fatal("Run did not end by itself")
			return nil
		}
	}
}

// TestSequenceCacheRaisedWhileRunning: a CACHE above 1 set on the outbox's
// sequence while the relay runs (sessions then hand out seqs out of order)
// ends Run with outbox.ErrSequence and the statement that fixes it.
func TestSequenceCacheRaisedWhileRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	wait := runErr(t, newRelay(t, b, rec, relay.Config{Workers: 2, DisableListen: true, PollInterval: 20 * time.Millisecond}))
	enqueue(t, b, keyed("d", 50, 5, 0)...)
	waitFor(t, "the first rows", func() bool { return distinct(rec) == 50 })
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE `+b.table()+` ALTER COLUMN seq SET CACHE 20`); err != nil {
		t.Fatal(err)
	}
	err := wait()
	if !errors.Is(err, outbox.ErrSequence) || !strings.Contains(err.Error(), "SET CACHE 1") {
		t.Fatalf("Run after CACHE 20 was set: %v; want outbox.ErrSequence, saying SET CACHE 1", err)
	}
	t.Log(err)
}

// restartSequence is ALTER SEQUENCE ... RESTART on the outbox's sequence.
const restartSequence = `DO $$ BEGIN EXECUTE format('ALTER SEQUENCE %s RESTART', pg_get_serial_sequence('idemq_outbox', 'seq')); END $$`

// TestSequenceRestartedWhileRunning: ALTER SEQUENCE ... RESTART on the
// outbox's sequence, without TRUNCATE, while the relay runs.
//
//   - burst: the restart and 300 new rows commit in one transaction, so
//     that the sequence's last value is above every value the relay has
//     seen by the time it looks again (a check of "last value below the
//     highest seen" misses it). The relay notices anyway (the sequence has
//     a new file) and reads from the start: every new row is published,
//     in order, without waiting for a rescan.
//   - dead letter above: a dead letter keeps its seq, now above the
//     sequence, so a replay would put it behind later messages of its key:
//     Run ends with outbox.ErrSequence and the setval that fixes it.
func TestSequenceRestartedWhileRunning(t *testing.T) {
	t.Run("burst", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := &recorder{}
		run(t, newRelay(t, b, rec, relay.Config{BatchSize: 50, DisableListen: true, PollInterval: 20 * time.Millisecond, RescanInterval: time.Hour}))
		enqueue(t, b, keyed("d", 200, 10, 0)...)
		waitFor(t, "the first 200", func() bool { return distinct(rec) == 200 && pending(t, b) == 0 })
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, restartSequence); err != nil {
				return err
			}
			return b.ob.EnqueueTx(b.ctx, tx, keyed("d", 300, 10, 200)...)
		})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the 300 enqueued after the restart", func() bool { return distinct(rec) == 500 })
		checkOrder(t, rec.deliveries())
	})
	t.Run("dead letter above", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := &recorder{fn: func(_ int, batch []relay.Message) error {
			f := relay.NewFailures(batch)
			for i, m := range batch {
				if !f.Skip(i) && string(m.Payload) == "poison" {
					f.Fail(i, idemq.Permanent(errors.New("refused")))
				}
			}
			return f.Err(context.Background())
		}}
		wait := runErr(t, newRelay(t, b, rec, relay.Config{DisableListen: true, PollInterval: 20 * time.Millisecond}))
		enqueue(t, b, keyed("d", 20, 2, 0)...)
		enqueue(t, b, outbox.Message{Destination: "d", Key: "k0", Payload: []byte("poison")})
		waitFor(t, "the dead letter", func() bool {
			d, err := b.ob.DeadLetters(b.ctx, outbox.DeadFilter{})
			return err == nil && len(d) == 1
		})
		if _, err := b.pool.Exec(b.ctx, restartSequence); err != nil {
			t.Fatal(err)
		}
		enqueue(t, b, keyed("d", 20, 2, 20)...)
		err := wait()
		if !errors.Is(err, outbox.ErrSequence) || !strings.Contains(err.Error(), "setval") {
			t.Fatalf("Run after the sequence restarted below a dead letter: %v; want outbox.ErrSequence, saying setval", err)
		}
		t.Log(err)
	})
}
