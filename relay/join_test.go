package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/idemqtest"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest"
)

// TestRelaysJoinAndAreSIGKILLed drains a keyed backlog with relays in child
// processes (this test binary re-executed; LeaseTTL 2 s) whose Sink
// commits every message it publishes into the table published and then
// takes 20 ms, a broker round trip. A starts alone and owns every
// partition; B joins and gets work; A is SIGKILLed mid-run and B takes A's
// partitions once A's lease expired; C joins and gets work; B is
// SIGKILLed and C takes over and drains the rest. Every message is
// published, the messages of each key first appear in enqueue order, and
// the only duplicates are the rows of batches the killed relays were
// publishing, at most one batch per kill, republished with the same ids.
func TestRelaysJoinAndAreSIGKILLed(t *testing.T) {
	if v, ok := relaytest.ChildArgs(t); ok {
		joinChild(t, v)
		return
	}
	t.Parallel()
	const n, keys, batch = 8000, 100, 20
	url, b := recordedBacklog(t, n, keys)
	pool := b.pool

	start := func(name string) *relaytest.Child { return relaytest.StartChild(t, name+" "+url, nil) }
	// owners returns the distinct owners of the partitions and how many
	// partitions are owned.
	owners := func() (map[string]int, int) {
		rows, err := pool.Query(b.ctx, `SELECT owner::text, count(*) FROM idemq_outbox_lease WHERE owner IS NOT NULL GROUP BY owner`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got, total := map[string]int{}, 0
		for rows.Next() {
			var o string
			var c int
			if err := rows.Scan(&o, &c); err != nil {
				t.Fatal(err)
			}
			got[o] = c
			total += c
		}
		return got, total
	}
	// soleOwner waits until one worker owns every partition, other than
	// the workers in not, and returns it.
	soleOwner := func(what string, not ...string) string {
		var sole string
		idemqtest.WaitFor(t, what, func() bool {
			got, total := owners()
			if len(got) != 1 || total != 64 {
				return false
			}
			for o := range got {
				sole = o
			}
			for _, x := range not {
				if sole == x {
					return false
				}
			}
			return true
		})
		return sole
	}

	a := start("A")
	idemqtest.WaitFor(t, "A's first batches", func() bool { return published(t, pool, "A") >= 5*batch })
	ownerA := soleOwner("A owning every partition")

	bChild := start("B")
	idemqtest.WaitFor(t, "B getting work", func() bool { return published(t, pool, "B") >= batch })
	idemqtest.WaitFor(t, "A and B splitting the partitions", func() bool { got, total := owners(); return len(got) == 2 && total == 64 })
	a.Kill(t)
	afterA := published(t, pool, "A")
	ownerB := soleOwner("B taking A's partitions after A's lease expired", ownerA)

	c := start("C")
	idemqtest.WaitFor(t, "C getting work", func() bool { return published(t, pool, "C") >= batch })
	bChild.Kill(t)
	soleOwner("C taking B's partitions after B's lease expired", ownerA, ownerB)
	if left := pendingRows(t, pool); left == 0 {
		t.Fatal("the backlog ran out before C took over: make it larger")
	}
	idemqtest.WaitFor(t, "an empty outbox", func() bool { return pendingRows(t, pool) == 0 })
	c.Kill(t)
	if published(t, pool, "A") != afterA {
		t.Fatal("A published after it was killed")
	}

	dups := checkPublished(t, pool, n)
	if dups > 2*batch {
		t.Fatalf("%d duplicates, want at most one batch per kill (%d)", dups, 2*batch)
	}
	t.Logf("published by A %d, B %d, C %d; %d duplicates", afterA, published(t, pool, "B"), published(t, pool, "C"), dups)
}

// joinChild is a child relay named by the first word of v, on the database
// at its second; it runs until it is killed (or, if the parent vanished,
// for at most two minutes).
func joinChild(t *testing.T, v string) {
	var name, url string
	if _, err := fmt.Sscan(v, &name, &url); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, pool)
	record := recordingSink(pool, name)
	sink := relay.SinkFunc(func(ctx context.Context, id relay.BatchID, batch []relay.Message) error {
		if err := record.Publish(ctx, id, batch); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	})
	run(t, newRelay(t, b, sink, relay.Config{BatchSize: 20, LeaseTTL: 2 * time.Second}))
	relaytest.Hang()
}

func pendingRows(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idemq_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
