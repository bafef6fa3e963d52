package relay_test

// The recorder of TestRelayHistory: relay child processes whose Sink
// records every publish durably in a database of its own, the enqueues
// recorded in the transactions that make them, and the loading of the
// whole history for the checker.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay"
	"github.com/idemq/idemq/relay/relaytest/history"
)

// historyChildEnv carries a relay child's historyChild, JSON.
const historyChildEnv = "RELAY_TEST_HISTORY_CHILD"

// relayAppName names the relays' outbox sessions, which the faults
// terminate.
const relayAppName = "history-relay"

// historyChild is what a relay child process is told.
type historyChild struct {
	OutboxURL  string // the outbox's database
	HistoryURL string // where publishes are recorded
	Name       string // relay name and incarnation, recorded with each publish
	Seed       uint64 // of the Sink's delays and failures
	Park       bool   // relay.Config.ParkFollowers
}

// The relays' settings: a pool of 2 for 3 workers, a Sink that is slow
// and sometimes very slow, short leases so that killed relays are taken
// over within the run.
const (
	historyWorkers  = 3
	historyPool     = 2
	historyLeaseTTL = 3 * time.Second
	historyBatch    = 20
)

// The Sink's behaviour: a delay per call (up to sinkSlow, one call in
// sinkVerySlowOdds up to sinkVerySlow), one message in sinkTransientOdds
// failed for a retry, and a permanent failure for the messages whose id
// ends in a multiple of 16 while younger than sinkRejectYoung: they
// become dead letters, and succeed once an operator replays them later.
const (
	sinkSlow          = 150 * time.Millisecond
	sinkVerySlow      = 2 * time.Second
	sinkVerySlowOdds  = 20
	sinkTransientOdds = 30
	sinkRejectYoung   = time.Second
)

// historyRelayChild runs a relay process until it is killed; it exits when
// the parent is gone (its stdin closes). Like a supervisor, it runs the
// relay again after Run returns an error.
func historyRelayChild(t *testing.T, spec historyChild) {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(spec.OutboxURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = historyPool
	cfg.ConnConfig.RuntimeParams["application_name"] = relayAppName
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	hist, err := pgxpool.New(ctx, spec.HistoryURL)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(pool, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sink := &recordingHistorySink{hist: hist, name: spec.Name, rng: rand.New(rand.NewPCG(spec.Seed, 0))}
	r, err := relay.New(pool, ob, sink, relay.Config{Workers: historyWorkers, BatchSize: historyBatch,
		LeaseTTL: historyLeaseTTL, PollInterval: 100 * time.Millisecond, PublishTimeout: 5 * time.Second,
		ParkFollowers: spec.Park, Logger: quiet,
		Retry: idemq.Retry{MaxAttempts: 1000, BaseDelay: 20 * time.Millisecond, MaxDelay: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		err := r.Run(ctx)
		fmt.Fprintf(os.Stderr, "relay %s: Run returned %v; running it again\n", spec.Name, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// recordingHistorySink is the relays' Sink: a publish is a committed row
// of the table published in the history database, with the message's
// seq, partition and lease token and the history server's clock; a
// rejection (a permanent failure) is one too.
type recordingHistorySink struct {
	hist *pgxpool.Pool
	name string
	mu   sync.Mutex
	rng  *rand.Rand
}

var (
	errTransient = errors.New("history sink: a passing failure")
	errRejected  = errors.New("history sink: rejected while young")
)

func (s *recordingHistorySink) Publish(ctx context.Context, _ relay.BatchID, batch []relay.Message) error {
	s.mu.Lock()
	delay := time.Duration(s.rng.Int64N(int64(sinkSlow)))
	if s.rng.IntN(sinkVerySlowOdds) == 0 {
		delay = time.Duration(s.rng.Int64N(int64(sinkVerySlow)))
	}
	transient := make([]bool, len(batch))
	for i := range transient {
		transient[i] = s.rng.IntN(sinkTransientOdds) == 0
	}
	s.mu.Unlock()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(delay):
	}
	f := relay.NewFailures(batch)
	var rec publishRecords
	for i, m := range batch {
		switch {
		case f.Skip(i):
		case transient[i]:
			f.Fail(i, errTransient)
		case m.ID[15]%16 == 0 && time.Since(time.Unix(m.ID.Time().UnixTime())) < sinkRejectYoung:
			f.Fail(i, idemq.Permanent(errRejected))
			rec.add("rejected", m)
		default:
			rec.add("published", m)
		}
	}
	if err := rec.insert(ctx, s.hist, s.name); err != nil {
		return err
	}
	return f.Err(ctx)
}

// publishRecords are the rows one Sink call records, as columns.
type publishRecords struct {
	outcomes, keys, dests []string
	ids                   []uuid.UUID
	seqs, tokens          []int64
	parts                 []int32
}

func (r *publishRecords) add(outcome string, m relay.Message) {
	r.outcomes = append(r.outcomes, outcome)
	r.ids = append(r.ids, m.ID)
	r.keys = append(r.keys, m.Key)
	r.dests = append(r.dests, m.Destination)
	r.seqs = append(r.seqs, m.Seq)
	r.parts = append(r.parts, int32(m.Partition))
	r.tokens = append(r.tokens, m.LeaseToken)
}

// insert commits the records in their order, each stamped with the history
// server's clock.
func (r *publishRecords) insert(ctx context.Context, hist *pgxpool.Pool, relayName string) error {
	if len(r.ids) == 0 {
		return nil
	}
	_, err := hist.Exec(ctx, `INSERT INTO published (outcome, id, key, destination, seq, relay, part, token)
SELECT o, i, k, d, s, $8, p, t FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::int8[], $6::int4[], $7::int8[])
  WITH ORDINALITY AS u(o, i, k, d, s, p, t, n) ORDER BY n`,
		r.outcomes, r.ids, r.keys, r.dests, r.seqs, r.parts, r.tokens, relayName)
	return err
}

// createHistoryTables creates the table published in the history database
// and, in the outbox's database, the records of enqueues, purges and
// partition lease grants (a trigger on the lease table) that commit with
// them.
func createHistoryTables(t *testing.T, hist, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	if _, err := hist.Exec(ctx, `CREATE TABLE published (
  n bigserial PRIMARY KEY, outcome text NOT NULL, id uuid NOT NULL, key text NOT NULL, destination text NOT NULL,
  seq bigint NOT NULL, relay text NOT NULL, part int NOT NULL, token bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE history_enqueued (id uuid PRIMARY KEY, key text NOT NULL, destination text NOT NULL, seq bigint NOT NULL, written timestamptz NOT NULL);
CREATE TABLE history_purged (id uuid NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE history_granted (part int NOT NULL, token bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION history_grant() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO history_granted (part, token) VALUES (NEW.part, NEW.token); RETURN NULL; END $$;
CREATE TRIGGER history_grant AFTER UPDATE OF token ON idemq_outbox_lease
  FOR EACH ROW WHEN (NEW.token <> OLD.token) EXECUTE FUNCTION history_grant()`); err != nil {
		t.Fatal(err)
	}
}

// enqueueRecorded enqueues msgs (their IDs set) in tx and records them
// with their seqs and the time before their seqs were drawn in the same
// transaction: a row is in the history if and only if its enqueue
// commits, and the record's xmin gives the commit's time. It returns the
// rows as "key/seq".
func enqueueRecorded(ctx context.Context, tx pgx.Tx, ob *outbox.Outbox, msgs []outbox.Message) ([]string, error) {
	var written time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&written); err != nil {
		return nil, err
	}
	if err := ob.EnqueueTx(ctx, tx, msgs...); err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	rows, err := tx.Query(ctx, `INSERT INTO history_enqueued (id, key, destination, seq, written)
SELECT id, coalesce(key, ''), destination, seq, $2 FROM idemq_outbox WHERE id = ANY($1)
RETURNING key || '/' || seq`, ids, written)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// purgeRecorded purges up to n random dead letters and records them in
// the same transaction, which stays open for hold. It returns them as
// "key/seq".
func purgeRecorded(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, n int, hold time.Duration) (purged []string, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Locked in seq order, as Replay and Purge lock them.
		rows, err := tx.Query(ctx, `SELECT id, coalesce(key, '') || '/' || seq FROM idemq_outbox_dead
WHERE seq IN (SELECT seq FROM idemq_outbox_dead ORDER BY random() LIMIT $1) ORDER BY seq FOR UPDATE`, n)
		if err != nil {
			return err
		}
		var ids []uuid.UUID
		var id uuid.UUID
		var row string
		if _, err := pgx.ForEachRow(rows, []any{&id, &row}, func() error {
			ids, purged = append(ids, id), append(purged, row)
			return nil
		}); err != nil || len(ids) == 0 {
			return err
		}
		if _, err := ob.PurgeTx(ctx, tx, outbox.DeadFilter{IDs: ids}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO history_purged (id) SELECT unnest($1::uuid[])`, ids); err != nil {
			return err
		}
		time.Sleep(hold)
		return nil
	})
	return purged, err
}

// loadHistory reads what the recorder recorded.
func loadHistory(t *testing.T, hist, pool *pgxpool.Pool) history.History {
	t.Helper()
	ctx := context.Background()
	var h history.History
	rows, err := pool.Query(ctx, `SELECT id, key, destination, seq, xmin::text::int8, written, pg_xact_commit_timestamp(xmin)
FROM history_enqueued`)
	if err != nil {
		t.Fatal(err)
	}
	var r history.Row
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Key, &r.Destination, &r.Seq, &r.Tx, &r.Written, &r.Committed}, func() error {
		h.Enqueued = append(h.Enqueued, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if rows, err = pool.Query(ctx, `SELECT id, at FROM history_purged`); err != nil {
		t.Fatal(err)
	}
	if h.Purged, err = pgx.CollectRows(rows, pgx.RowToStructByPos[history.Purge]); err != nil {
		t.Fatal(err)
	}
	if rows, err = hist.Query(ctx, `SELECT outcome, id, key, destination, seq, relay, part, token, at FROM published ORDER BY n`); err != nil {
		t.Fatal(err)
	}
	var outcome string
	var p history.Publish
	if _, err := pgx.ForEachRow(rows, []any{&outcome, &p.ID, &p.Key, &p.Destination, &p.Seq, &p.Relay, &p.Partition, &p.LeaseToken, &p.At}, func() error {
		if outcome == "rejected" {
			h.Rejected = append(h.Rejected, p)
		} else {
			h.Published = append(h.Published, p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return h
}

// historyRelays are the relay child processes; a killed one is started
// again at once, under a new incarnation name.
type historyRelays struct {
	t     *testing.T
	spec  historyChild
	mu    sync.Mutex
	procs []*exec.Cmd
	runs  int
}

func startHistoryRelays(t *testing.T, spec historyChild, n int) *historyRelays {
	t.Helper()
	rs := &historyRelays{t: t, spec: spec, procs: make([]*exec.Cmd, n)}
	t.Cleanup(rs.stop)
	for i := range n {
		if err := rs.start(i); err != nil {
			t.Fatal(err)
		}
	}
	return rs
}

// start runs relay i, as the test binary re-executed.
func (rs *historyRelays) start(i int) error {
	rs.runs++
	spec := rs.spec
	spec.Name = fmt.Sprintf("relay%d.%d", i, rs.runs)
	spec.Seed += uint64(rs.runs)
	env, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRelayHistory$", "-test.count=1")
	cmd.Env = append(os.Environ(), historyChildEnv+"="+string(env))
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil { // closes when this process dies
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start relay %s: %w", spec.Name, err)
	}
	rs.procs[i] = cmd
	return nil
}

// kill SIGKILLs relay i and starts it again.
func (rs *historyRelays) kill(i int) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.end(rs.procs[i])
	if err := rs.start(i); err != nil {
		rs.t.Error(err)
	}
}

// pause stops relay i for d (SIGSTOP, then SIGCONT). A relay killed
// meanwhile stays killed and its successor runs.
func (rs *historyRelays) pause(i int, d time.Duration) error {
	if stopSignal == nil {
		return nil
	}
	rs.mu.Lock()
	p := rs.procs[i].Process
	rs.mu.Unlock()
	if err := p.Signal(stopSignal); err != nil {
		return err
	}
	time.Sleep(d)
	if err := p.Signal(contSignal); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// stop SIGKILLs every relay.
func (rs *historyRelays) stop() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i, cmd := range rs.procs {
		rs.end(cmd)
		rs.procs[i] = nil
	}
}

// end SIGKILLs cmd; a relay that had exited by itself fails the test.
func (rs *historyRelays) end(cmd *exec.Cmd) {
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	if err := cmd.Wait(); cmd.ProcessState.ExitCode() != -1 {
		rs.t.Errorf("a relay process exited by itself before it was killed: %v", err)
	}
}

// loadGrants reads the partition lease grants the trigger recorded: when
// the take wrote the token, and when its transaction committed.
func loadGrants(t *testing.T, pool *pgxpool.Pool) []grant {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT part, token, at, pg_xact_commit_timestamp(xmin) FROM history_granted`)
	if err != nil {
		t.Fatal(err)
	}
	grants, err := pgx.CollectRows(rows, pgx.RowToStructByPos[grant])
	if err != nil {
		t.Fatal(err)
	}
	return grants
}
