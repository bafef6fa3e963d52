package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
	"github.com/idemq/idemq/testenv"
)

// TestRelaySIGKILLedBetweenPublishAndDelete runs a relay in a child process
// (this test binary re-executed) whose Sink records every message it
// publishes in a table, committed, and then hangs on its third batch: the
// parent SIGKILLs it between that publish and the batch's delete. A relay
// in the parent then drains the outbox. Every message is published, the
// messages of each key first appear in enqueue order, and the only
// duplicates are the rows of the batch the child died with, republished
// with the same ids.
func TestRelaySIGKILLedBetweenPublishAndDelete(t *testing.T) {
	if url, ok := relaytest.ChildArgs(t); ok {
		sigkillChild(t, url)
		return
	}
	t.Parallel()
	const n, keys, batch = 300, 10, 20
	url, b := recordedBacklog(t, n, keys)
	pool := b.pool

	child := relaytest.StartChild(t, url, nil)
	idemqtest.WaitFor(t, "the child's third batch", func() bool { return published(t, pool, "child") >= 3*batch })
	child.Kill(t)

	run(t, newRelay(t, b, recordingSink(pool, "parent"), relay.Config{BatchSize: batch}))
	idemqtest.WaitFor(t, "an empty outbox", func() bool { return pending(t, b) == 0 })

	if dups := checkPublished(t, pool, n); dups == 0 || dups > batch {
		t.Fatalf("%d duplicates, want between 1 and one batch (%d): the rows of the batch the child died with", dups, batch)
	}
}

// sigkillChild is the child process: a relay that hangs after publishing
// its third batch, until it is killed (or, if the parent vanished, for at
// most two minutes).
func sigkillChild(t *testing.T, url string) {
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, pool)
	record := recordingSink(pool, "child")
	calls := 0
	sink := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
		if err := record.Publish(ctx, id, batch); err != nil {
			return err
		}
		if calls++; calls == 3 {
			time.Sleep(2 * time.Minute) // killed here, before the delete commits
		}
		return nil
	})
	run(t, newRelay(t, b, sink, relay.Config{BatchSize: 20, PublishTimeout: 5 * time.Minute}))
	relaytest.Hang()
}

// recordedBacklog migrates the default outbox on a new database, creates the
// table published that recordingSink fills, and enqueues n messages over
// keys keys. It returns the database's URL, for child processes.
func recordedBacklog(t *testing.T, n, keys int) (string, bundle) {
	t.Helper()
	url := testenv.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := setupOn(t, pool)
	if _, err := pool.Exec(b.ctx, `CREATE TABLE published (n bigserial, id uuid, key text, payload text, by text)`); err != nil {
		t.Fatal(err)
	}
	enqueue(t, b, keyed("d", n, keys, 0)...)
	return url, b
}

// checkPublished checks what recordingSinks published: all n messages,
// each key's messages first appearing in enqueue order, none more than
// twice. It returns the number of duplicates.
func checkPublished(t *testing.T, pool *pgxpool.Pool, n int) int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id::text, key, payload FROM published ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	var deliveries []relay.Message
	seen := map[string]int{}
	for rows.Next() {
		var id string
		var m relay.Message
		if err := rows.Scan(&id, &m.Key, &m.Payload); err != nil {
			t.Fatal(err)
		}
		seen[id]++
		deliveries = append(deliveries, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	dups := checkOrder(t, deliveries)
	if len(seen) != n || len(deliveries) != n+dups {
		t.Fatalf("%d distinct messages in %d deliveries with %d duplicates, want %d", len(seen), len(deliveries), dups, n)
	}
	for id, c := range seen {
		if c > 2 {
			t.Fatalf("message %s published %d times", id, c)
		}
	}
	return dups
}

// recordingSink commits every message it publishes into the table
// published, as a broker would keep it.
func recordingSink(pool *pgxpool.Pool, by string) relay.Sink {
	return relay.SinkFunc(func(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
		ids, keys, payloads := make([]string, len(batch)), make([]string, len(batch)), make([]string, len(batch))
		for i, m := range batch {
			ids[i], keys[i], payloads[i] = m.ID.String(), m.Key, string(m.Payload)
		}
		_, err := pool.Exec(ctx, `INSERT INTO published (id, key, payload, by)
SELECT i::uuid, k, p, $4 FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS u(i, k, p, o) ORDER BY o`, ids, keys, payloads, by)
		return err
	})
}

func published(t testing.TB, pool *pgxpool.Pool, by string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM published WHERE by = $1`, by).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// setupOn migrates the default outbox on pool.
func setupOn(t testing.TB, pool *pgxpool.Pool) bundle {
	t.Helper()
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return bundle{ctx: context.Background(), pool: pool, ob: ob}
}
