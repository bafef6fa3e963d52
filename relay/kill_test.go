package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/relay"
)

// enqueueInBackground writes n messages over keys keys in transactions of
// 100 while the relays run.
func enqueueInBackground(t *testing.T, b bundle, n, keys int) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Go(func() {
		for from := 0; from < n; from += 100 {
			err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				return b.ob.EnqueueTx(b.ctx, tx, keyed("d", min(100, n-from), keys, from)...)
			})
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	return &wg
}

func TestThreeRelaysExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	for range 3 {
		run(t, newRelay(t, b, rec, relay.Config{BatchSize: 100}))
	}
	enqueueInBackground(t, b, 10000, 100).Wait()
	idemqtest.WaitFor(t, "10,000 deliveries", func() bool { return distinct(rec) == 10000 })
	if dups := checkOrder(t, rec.deliveries()); dups != 0 {
		t.Fatalf("%d duplicates without a crash", dups)
	}
}

// TestThreeRelaysOneKilledBetweenPublishAndDelete cancels a relay (no grace)
// while its sink has published a batch: the batch's rows go back and the
// other relays publish them again. Duplicates are exactly those rows.
func TestThreeRelaysOneKilledBetweenPublishAndDelete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	var killedBatch []relay.Message
	published := make(chan struct{})
	var calls atomic.Int64
	victim := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
		if calls.Add(1) != 5 {
			return rec.Publish(ctx, id, batch)
		}
		if err := rec.Publish(ctx, id, batch); err != nil {
			return err
		}
		killedBatch = batch
		close(published)
		<-ctx.Done() // the crash: the delete never commits
		return ctx.Err()
	})
	stopVictim := run(t, newRelay(t, b, victim, relay.Config{BatchSize: 100, ShutdownGrace: 1}))
	for range 2 {
		run(t, newRelay(t, b, rec, relay.Config{BatchSize: 100}))
	}
	wg := enqueueInBackground(t, b, 10000, 100)
	<-published
	stopVictim()
	wg.Wait()
	idemqtest.WaitFor(t, "10,000 deliveries", func() bool { return distinct(rec) == 10000 && pending(t, b) == 0 })
	dups := checkOrder(t, rec.deliveries())
	killed := map[string]bool{}
	for _, m := range killedBatch {
		killed[m.ID.String()] = true
	}
	count := map[string]int{}
	for _, m := range rec.deliveries() {
		count[m.ID.String()]++
	}
	for id, n := range count {
		if n > 1 && !killed[id] {
			t.Fatalf("message %s delivered %d times but was not in the killed batch", id, n)
		}
	}
	if dups != len(killedBatch) {
		t.Fatalf("%d duplicates, want the %d rows of the killed batch", dups, len(killedBatch))
	}
}

// TestTerminatedConnectionMidBatch kills the relay's database session with
// pg_terminate_backend while its batch is being published: the claim rolls
// back, and another relay (or the same one, reconnected) delivers the rows.
func TestTerminatedConnectionMidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "relay-victim"
	victimPool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victimPool.Close)

	rec := &recorder{}
	var killedBatch []relay.Message
	var terminated atomic.Int64
	var calls atomic.Int64
	victim := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
		if err := rec.Publish(ctx, id, batch); err != nil {
			return err
		}
		if calls.Add(1) == 3 {
			killedBatch = batch
			var n int64
			if err := b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'relay-victim' AND state LIKE 'idle in transaction%'`).Scan(&n); err != nil {
				return err
			}
			terminated.Store(n)
		}
		return nil
	})
	r, err := relay.New(victimPool, b.ob, victim, relay.Config{BatchSize: 100, Logger: quiet, DisableListen: true, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The victim runs alone until its session is killed (with a second
	// relay from the start it could be left fewer than three batches), then
	// a healthy relay joins it.
	run(t, r)
	writers := enqueueInBackground(t, b, 3000, 50)
	idemqtest.WaitFor(t, "the victim's third batch", func() bool { return calls.Load() >= 3 })
	run(t, newRelay(t, b, rec, relay.Config{BatchSize: 100}))
	writers.Wait()
	idemqtest.WaitFor(t, "3,000 deliveries", func() bool { return distinct(rec) == 3000 && pending(t, b) == 0 })
	if terminated.Load() != 1 {
		t.Fatalf("terminated %d sessions, want the victim's one", terminated.Load())
	}
	dups := checkOrder(t, rec.deliveries())
	if dups != len(killedBatch) {
		t.Fatalf("%d duplicates, want the %d rows of the killed batch", dups, len(killedBatch))
	}
}
