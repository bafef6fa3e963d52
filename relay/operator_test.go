package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/testenv"
)

// TestOpenDeadLetterTransactionDuringRebalance: an operator's ReplayTx is
// left open while the relays rebalance. The replay holds the lease rows of
// its keys' partitions (all 64 when it moves an unkeyed dead letter back).
// Relays A and B split the partitions; the operator opens the replay; C
// joins, so A and B must give partitions up; then B leaves (stops) or dies
// (its network goes away, its heartbeat with it). Meanwhile rows keep
// coming on keys of every partition. No relay may wait for the operator:
// every row of a partition that a live relay owns, or that changes hands
// (it is free or its owner died and the operator does not hold it), is
// published while the replay is open. The bound: a partition the operator
// holds does not change hands until the replay ends, so a dead owner's such
// partitions wait for it. Once the operator commits, everything is
// published, the replayed messages before their keys' followers.
func TestOpenDeadLetterTransactionDuringRebalance(t *testing.T) {
	for _, tc := range []struct {
		name    string
		unkeyed bool // the replay moves an unkeyed dead letter: it holds every partition
		die     bool // B dies instead of leaving
	}{
		{"keyed/leave", false, false},
		{"keyed/die", false, true},
		{"unkeyed/leave", true, false},
		{"unkeyed/die", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b, proxy, bcfg := proxied(t)

			// The dead keys: one in every eighth partition, so that any
			// eight partitions in a row a worker gives up include one.
			var locked []int
			var deadKeys []string
			for p := 3; p < 64; p += 8 {
				locked = append(locked, p)
				deadKeys = append(deadKeys, keyIn(t, b, "dead", p))
			}
			if tc.unkeyed {
				locked = nil
				for p := range 64 {
					locked = append(locked, p)
				}
			}

			var poison atomic.Bool
			poison.Store(true)
			rec := &recorder{fn: func(_ int, batch []relay.Message) error {
				f := relay.NewFailures(batch)
				for i, m := range batch {
					if !f.Skip(i) && poison.Load() && m.Destination == "dl" {
						f.Fail(i, idemq.Permanent(errors.New("poison")))
					}
				}
				return f.Err(ctx)
			}}
			rcfg := relay.Config{BatchSize: 20, ParkFollowers: true, DisableListen: true, PollInterval: 20 * time.Millisecond, LeaseTTL: time.Second}
			run(t, newRelay(t, b, rec, rcfg))

			// B reaches the server through the proxy, to die by losing it.
			stopB := run(t, newRelay(t, bundle{ctx, openPool(t, bcfg), b.ob}, rec, rcfg))
			waitFor(t, "A and B splitting the partitions", func() bool { return liveOwners(t, b) == 2 })

			// The dead letters: the head of every dead key (and an unkeyed
			// message), with a follower each enqueued after it died.
			var dead []outbox.Message
			for _, k := range deadKeys {
				dead = append(dead, outbox.Message{Destination: "dl", Key: k, Payload: []byte(k + ":0")})
			}
			if tc.unkeyed {
				dead = append(dead, outbox.Message{Destination: "dl", Payload: []byte("unkeyed-dead")})
			}
			enqueue(t, b, dead...)
			waitFor(t, "the dead letters", func() bool {
				d, err := b.ob.DeadLetters(ctx, outbox.DeadFilter{Limit: 1000})
				return err == nil && len(d) == len(dead)
			})
			poison.Store(false)
			var followers []outbox.Message
			for _, k := range deadKeys {
				followers = append(followers, outbox.Message{Destination: "dl", Key: k, Payload: []byte(k + ":1")})
			}
			enqueue(t, b, followers...)

			op, err := b.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer op.Rollback(ctx)
			if n, err := b.ob.ReplayTx(ctx, op, outbox.DeadFilter{Destination: "dl", Limit: 1000}); err != nil || n != int64(len(dead)) {
				t.Fatalf("ReplayTx: %d, %v; want %d", n, err, len(dead))
			}

			// C joins: A and B must give partitions up, some of them held
			// by the operator.
			run(t, newRelay(t, b, rec, rcfg))
			waitFor(t, "C joining", func() bool { return liveRelays(t, b) == 3 && (liveOwners(t, b) == 3 || tc.unkeyed) })
			if tc.die {
				proxy.Stop() // B's connections and heartbeat are gone
			} else {
				stopB()
			}
			waitFor(t, "B gone", func() bool { return liveRelays(t, b) == 2 })
			// B's partitions change hands, but for those the operator holds.
			var gone []int
			waitFor(t, "B's partitions taken, but for those the operator holds", func() bool {
				gone = ownedByGone(t, b)
				return slices.Equal(gone, intersect(gone, locked))
			})
			parts := partitionsOf(t, b, 256)
			// Rows on keys of every partition, in several transactions.
			const keys, per = 256, 4
			for i := range per {
				enqueue(t, b, keyed("d", keys, keys, i*keys)...)
			}
			flowing := func() (want, got int) {
				byKey := map[string]int{}
				for _, m := range rec.deliveries() {
					if m.Destination == "d" {
						byKey[m.Key]++
					}
				}
				for k := range keys {
					key := fmt.Sprint("k", k)
					if slices.Contains(gone, parts[key]) {
						continue
					}
					want += per
					got += min(byKey[key], per)
				}
				return want, got
			}
			waitFor(t, "every row of a partition with a live owner while the replay is open", func() bool {
				want, got := flowing()
				return want == got
			})
			want, _ := flowing()
			if n := count(rec, "dead") + count(rec, "unkeyed-dead"); n != 0 {
				t.Fatalf("%d replayed messages or followers published before the operator committed", n)
			}

			if err := op.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			committed := time.Now()
			waitFor(t, "the partitions the operator held taken once it committed", func() bool { return len(ownedByGone(t, b)) == 0 })
			t.Logf("partitions without a live owner taken %v after the commit", time.Since(committed).Round(time.Millisecond))
			waitFor(t, "everything once the operator committed", func() bool {
				return distinct(rec) == keys*per+len(dead)+len(followers) && pending(t, b) == 0
			})
			checkOrder(t, rec.deliveries())
			for _, k := range deadKeys {
				var got []string
				for _, m := range rec.deliveries() {
					if m.Key == k && m.Destination == "dl" {
						got = append(got, string(m.Payload))
					}
				}
				// The poisoned attempt is not recorded (it failed).
				if strings.Join(got, ",") != k+":0,"+k+":1" {
					t.Fatalf("key %s published %q, want the replayed head, then its follower", k, got)
				}
			}
			t.Logf("%d rows of partitions with a live owner published while the replay was open; %d partitions waited for it (their owner was gone)", want, len(gone))
		})
	}
}

// proxied returns a fresh database with the outbox's tables, a proxy in
// front of its server, and a pool configuration that goes through it.
func proxied(t *testing.T) (bundle, *testenv.Proxy, *pgxpool.Config) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	b := setupOn(t, openPool(t, cfg.Copy()))
	proxy := testenv.NewProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	host, port, _ := net.SplitHostPort(proxy.Addr())
	pn, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(pn)
	return b, proxy, cfg
}

// keyIn returns a key prefix0, prefix1, ... in relay partition part.
func keyIn(t *testing.T, b bundle, prefix string, part int) string {
	t.Helper()
	var k string
	err := b.pool.QueryRow(b.ctx, `SELECT $1 || i FROM generate_series(0, 100000) AS i
WHERE mod(hashtext($1 || i)::int8 + 2147483648, 64) = $2 LIMIT 1`, prefix, part).Scan(&k)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// partitionsOf returns the relay partitions of the keys k0..k(n-1) of
// keyed.
func partitionsOf(t *testing.T, b bundle, n int) map[string]int {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT 'k' || i, mod(hashtext('k' || i)::int8 + 2147483648, 64)::int FROM generate_series(0, $1 - 1) AS i`, n)
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]int{}
	for rows.Next() {
		var k string
		var p int
		if err := rows.Scan(&k, &p); err != nil {
			t.Fatal(err)
		}
		parts[k] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return parts
}

// liveRelays counts the live relay workers.
func liveRelays(t *testing.T, b bundle) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idemq_outbox_relays WHERE expires_at > now()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// liveOwners counts the distinct live owners of partitions.
func liveOwners(t *testing.T, b bundle) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT l.owner) FROM idemq_outbox_lease AS l
JOIN idemq_outbox_relays AS w ON w.owner = l.owner AND w.expires_at > now()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ownedByGone lists the partitions whose owner is not alive (or nobody).
func ownedByGone(t *testing.T, b bundle) []int {
	t.Helper()
	var parts []int
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(array_agg(part ORDER BY part), '{}') FROM idemq_outbox_lease AS l
WHERE NOT EXISTS (SELECT 1 FROM idemq_outbox_relays AS w WHERE w.owner = l.owner AND w.expires_at > now())`).Scan(&parts); err != nil {
		t.Fatal(err)
	}
	return parts
}

func intersect(a, b []int) []int {
	var out []int
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
