package relay_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// busyPoolEnv sets how long TestBusyPoolKeepsLeases watches the leases;
// `make soak` sets it to a minute.
const busyPoolEnv = "IDEMQ_RELAY_BUSY_POOL"

// TestBusyPoolKeepsLeases runs 48 workers on a pool of 4 connections into
// a Sink that takes 400 ms, while rows of every partition keep coming: the
// work pool is always exhausted, and every batch holds a connection for the
// whole publish. The workers' leases must still be renewed on time, so
// that no partition changes hands after its first take (its token stays
// 1): a hand-over of a live worker's partition is a window for a double
// publish and a reorder.
func TestBusyPoolKeepsLeases(t *testing.T) {
	watch := 15 * time.Second
	if v := os.Getenv(busyPoolEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", busyPoolEnv, v, err)
		}
		watch = d
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := bundle{ctx: ctx, pool: pool, ob: ob}

	var batches atomic.Int64
	sink := relay.SinkFunc(func(ctx context.Context, _ []relay.Message) error {
		batches.Add(1)
		select {
		case <-time.After(400 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// Rows of 256 keys (every partition) keep coming, so that every
	// worker always has a batch to publish.
	feed, stopFeed := context.WithCancel(ctx)
	var fed sync.WaitGroup
	fed.Go(func() {
		for from := 0; feed.Err() == nil; from += 256 {
			err := pgx.BeginFunc(feed, pool, func(tx pgx.Tx) error { return ob.EnqueueTx(feed, tx, keyed("d", 256, 256, from)...) })
			if err != nil && feed.Err() == nil {
				t.Error(err)
				return
			}
			select {
			case <-feed.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() { stopFeed(); fed.Wait() })

	stop := run(t, newRelay(t, b, sink, relay.Config{Workers: 48, BatchSize: 50, LeaseTTL: 2 * time.Second}))
	defer stop()
	const lease = "idemq_outbox_lease"
	waitFor(t, "every partition owned", func() bool {
		var owned int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+lease+` WHERE owner IS NOT NULL`).Scan(&owned)
		return err == nil && owned == 64
	})
	time.Sleep(watch)
	before := batches.Load()
	rows, err := pool.Query(ctx, `SELECT part, token FROM `+lease+` WHERE token <> 1 ORDER BY part`)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Part, Token int64 }])
	if err != nil {
		t.Fatal(err)
	}
	handOvers := int64(0)
	for _, m := range moved {
		handOvers += m.Token - 1
	}
	if len(moved) > 0 {
		t.Fatalf("%d hand-overs beyond the first take in %v (partition, token): %v", handOvers, watch, moved)
	}
	if before < int64(watch/time.Second) {
		t.Fatalf("only %d batches published in %v: the pool was not busy", before, watch)
	}
	t.Logf("%d batches in %v, no hand-over", before, watch)
}
