package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay/relaytest/history"
	"github.com/idemq/idemq/testenv"
)

// The knobs of TestRelayHistory. make soak sets a long duration.
const (
	historyDurationEnv     = "IDEMQ_HISTORY_DURATION" // how long the faults go on; default 15s
	historySeedEnv         = "IDEMQ_HISTORY_SEED"     // the schedule's seed; default random
	historyRelayCount      = 3                        // relay processes
	historyFaultInterval   = 400 * time.Millisecond   // mean time between two faults
	historyBound           = 30 * time.Second         // every row published this long after the faults stop
	historyDurationDefault = 15 * time.Second
)

// TestRelayHistory is the relay's randomized fault test, in three parts:
//
//   - The fault schedule (history_faults_test.go): three relay processes
//     (this binary re-executed), each with 3 workers on a pool of 2 and a
//     slow Sink, on one outbox, while a producer enqueues over 40 keys;
//     at random times a relay is SIGKILLed (and restarted) or paused
//     (SIGSTOP, at times beyond its batch's server deadline), a relay
//     session is terminated, an outside session locks random outbox rows
//     FOR UPDATE, a writer transaction stays open, a prepared transaction
//     that enqueued commits (or rolls back) seconds later, and an operator
//     replays or purges dead letters in a transaction left open (the Sink
//     rejects some young messages, so dead letters exist). Each phase of
//     5 s draws the kinds it injects.
//   - The recorder (history_recorder_test.go): each Sink commits every
//     publish and rejection, with the message's seq, partition and lease
//     token, to a table in another database, stamped by that server's
//     clock; each enqueue and purge is recorded in its own transaction.
//   - The checks (package relay/relaytest/history): per-key order of first
//     publications (a row before the rows of its key enqueued after it
//     committed), no publish by a partition's owner after its
//     successor's first publish, nothing lost, no publish of a rolled-back
//     row, and every row published within 30 s of the faults stopping;
//     and each partition's grants and publishes linearizable against a
//     lease whose token only grows (linear_test.go).
//
// The seed (logged; IDEMQ_HISTORY_SEED sets it) fixes the schedule: kinds,
// times, durations, victims, and whether the relays park followers behind
// dead letters. The interleaving with the relays is the machine's.
func TestRelayHistory(t *testing.T) {
	if v := os.Getenv(historyChildEnv); v != "" {
		var spec historyChild
		if err := json.Unmarshal([]byte(v), &spec); err != nil {
			t.Fatal(err)
		}
		historyRelayChild(t, spec)
		return
	}
	t.Parallel()
	duration, seed := historySettings(t)
	park := seed%2 == 1
	t.Logf("seed %d (rerun with %s=%d), faults for %s, ParkFollowers %v", seed, historySeedEnv, seed, duration, park)
	ctx := context.Background()

	// The outbox on a server of its own, which allows prepared
	// transactions and keeps commit times; the publishes recorded on the
	// machine's server.
	srv := testenv.PrivatePostgres(t, "max_prepared_transactions=20", "track_commit_timestamp=on")
	pool := outsidePool(t, srv.URL())
	b := setupOn(t, pool)
	histURL := testenv.PostgresURL(t)
	hist, err := pgxpool.New(ctx, histURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hist.Close)
	createHistoryTables(t, hist, pool)
	prepared, err := outbox.New(pool, outbox.Config{DisableNotify: true})
	if err != nil {
		t.Fatal(err)
	}
	relays := startHistoryRelays(t, historyChild{OutboxURL: srv.URL(), HistoryURL: histURL, Seed: seed, Park: park}, historyRelayCount)

	// Load and faults.
	start := time.Now()
	faulty, stop := context.WithTimeout(ctx, duration)
	defer stop()
	var load sync.WaitGroup
	load.Go(func() { produce(faulty, t, b) })
	f := &faults{t: t, pool: pool, ob: b.ob, prepared: prepared, relays: relays, count: map[fault]int{}}
	f.schedule(faulty, rand.New(rand.NewPCG(seed, seed)), historyFaultInterval)
	load.Wait()

	// Quiet: every fault has ended. An operator replays the dead letters
	// until the outbox and the dead letters are empty, for at most the
	// bound (and a little: what is left then is lost or late).
	quiet := time.Now()
	left := drain(t, b, quiet.Add(historyBound+5*time.Second))
	relays.stop()
	t.Logf("faults: %s; quiet after %s, drained in %s: %s", f.counts(), quiet.Sub(start).Round(time.Second),
		time.Since(quiet).Round(time.Second), left)

	h := loadHistory(t, hist, pool)
	report, err := history.Check(h, history.Rules{ParkFollowers: park, QuietFrom: quiet, Bound: historyBound})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(report)
	if illegal := checkLeases(t, leaseHistories(loadGrants(t, pool), h.Published), ""); len(illegal) > 0 {
		t.Errorf("seed %d: partition leases not linearizable: %v", seed, illegal)
	}
	if err := report.Err(); err != nil {
		t.Logf("the faults (rows as key/seq):\n%s", strings.Join(f.timeline, "\n"))
		t.Log(f.blame(report))
		t.Fatalf("seed %d (rerun with %s=%d): %v", seed, historySeedEnv, seed, err)
	}
}

// historySettings reads the duration and the seed from the environment.
func historySettings(t *testing.T) (time.Duration, uint64) {
	duration, seed := historyDurationDefault, rand.Uint64()
	if v := os.Getenv(historyDurationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", historyDurationEnv, v)
		}
		duration = d
	}
	if v := os.Getenv(historySeedEnv); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want the unsigned number a failed run logged", historySeedEnv, v)
		}
		seed = s
	}
	return duration, seed
}

// outsidePool is the pool of the outside sessions: the producer, the
// faults and the operator.
func outsidePool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 30
	cfg.ConnConfig.RuntimeParams["application_name"] = "history-fault"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// produce enqueues transactions of 1 to 8 messages, about 40 a second,
// until ctx is done.
func produce(ctx context.Context, t *testing.T, b bundle) {
	for ctx.Err() == nil {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := enqueueRecorded(ctx, tx, b.ob, historyMessages(1+rand.IntN(8)))
			return err
		})
		if err != nil && ctx.Err() == nil {
			t.Errorf("produce: %v", err)
			return
		}
		time.Sleep(time.Duration(15+rand.IntN(20)) * time.Millisecond)
	}
}

// drain replays the dead letters until the outbox and the dead letters are
// empty or deadline passes, and says what is left.
func drain(t *testing.T, b bundle, deadline time.Time) string {
	for {
		if _, err := b.ob.Replay(b.ctx, outbox.DeadFilter{All: true}); err != nil {
			t.Fatal(err)
		}
		st, err := b.ob.Stats(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 && st.Dead == 0 || time.Now().After(deadline) {
			return fmt.Sprintf("%d rows pending (the oldest %s), %d dead letters", st.Pending, st.OldestPending.Round(time.Millisecond), st.Dead)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
