package relay_test

// The fault schedule of TestRelayHistory: at random times (from a seed),
// one of the production events below, each running on its own for a
// bounded time, several at once.

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq/outbox"
	"github.com/idemq/idemq/relay/relaytest/history"
)

// fault is one kind of event the schedule injects.
type fault string

const (
	faultKill      fault = "sigkill"        // SIGKILL a relay process; it restarts at once
	faultTerminate fault = "terminate"      // pg_terminate_backend of a relay session
	faultLockRows  fault = "lock-rows"      // an outside session holds random outbox rows FOR UPDATE
	faultWriter    fault = "long-writer"    // a writer transaction stays open
	faultPrepared  fault = "prepared"       // a prepared transaction that enqueued commits (or rolls back) later
	faultReplay    fault = "replay"         // an operator replays dead letters, transaction held open
	faultPurge     fault = "purge"          // an operator purges dead letters, transaction held open
	faultRollback  fault = "prepared-abort" // a prepared transaction that enqueued rolls back
	faultPause     fault = "pause"          // SIGSTOP a relay process, SIGCONT it later
)

// faultKinds are the faults the schedule draws from.
var faultKinds = []fault{faultKill, faultTerminate, faultLockRows, faultWriter, faultPrepared, faultRollback, faultReplay, faultPurge, faultPause}

// historyPhase is how long a set of enabled fault kinds lasts.
const historyPhase = 5 * time.Second

// longPause outlasts a relay's server-side deadline for its batch
// (PublishTimeout + 10 s): the server ends the paused relay's transaction
// and its partitions can be taken over while it still holds the rows it
// claimed.
const longPause = 16 * time.Second

// faults injects faults into one outbox and its relays.
type faults struct {
	t        *testing.T
	pool     *pgxpool.Pool  // the outside sessions (application_name history-fault)
	ob       *outbox.Outbox // enqueues of the long writer
	prepared *outbox.Outbox // enqueues of prepared transactions: no NOTIFY, which PREPARE refuses
	relays   *historyRelays

	wg       sync.WaitGroup
	mu       sync.Mutex
	count    map[fault]int
	gid      int
	timeline []string // what each fault did, and when
}

// schedule injects faults until ctx is done, in phases of historyPhase:
// each phase enables a random half of the kinds (at least one), so that a
// run has stretches with and without each (without kills and pauses a
// relay keeps its leases and cursors, which hides some bugs), and injects
// them at random times, every mean on average. It returns once every
// fault it started has ended (locks released, prepared transactions
// resolved, relays resumed).
func (f *faults) schedule(ctx context.Context, rng *rand.Rand, mean time.Duration) {
	defer f.wg.Wait()
	var enabled []fault
	var phaseEnd time.Time
	for {
		if time.Now().After(phaseEnd) {
			enabled = nil
			for len(enabled) == 0 {
				for _, k := range faultKinds {
					if rng.IntN(2) == 0 {
						enabled = append(enabled, k)
					}
				}
			}
			phaseEnd = time.Now().Add(historyPhase)
			f.note("phase", "%v", enabled)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(mean/4 + time.Duration(rng.Int64N(int64(mean)*3/2))):
		}
		kind := enabled[rng.IntN(len(enabled))]
		hold := 500*time.Millisecond + time.Duration(rng.Int64N(int64(4*time.Second)))
		if long := longPause + time.Duration(rng.Int64N(int64(4*time.Second))); kind == faultPause && rng.IntN(4) == 0 && f.before(ctx, long) {
			hold = long
		}
		victim, size := rng.IntN(len(f.relays.procs)), 1+rng.IntN(10)
		f.wg.Go(func() {
			if err := f.inject(kind, victim, size, hold); err != nil {
				f.t.Errorf("fault %s: %v", kind, err)
			}
		})
	}
}

// before reports whether d from now is before ctx's deadline: a long
// pause must not hold up the quiet.
func (f *faults) before(ctx context.Context, d time.Duration) bool {
	end, ok := ctx.Deadline()
	return !ok || time.Until(end) > d
}

// inject runs one fault: relay victim for a kill, size rows or dead
// letters, hold for how long a session keeps its locks or transaction.
// It notes in the timeline what it did.
func (f *faults) inject(kind fault, victim, size int, hold time.Duration) error {
	f.mu.Lock()
	f.count[kind]++
	f.gid++
	gid := fmt.Sprintf("history-%d", f.gid)
	f.mu.Unlock()
	ctx := context.Background()
	held := fmt.Sprintf("held %s", hold.Round(time.Millisecond))
	switch kind {
	case faultKill:
		f.note(kind, "relay%d", victim)
		f.relays.kill(victim)
	case faultPause:
		f.note(kind, "relay%d, %s", victim, held)
		return f.relays.pause(victim, hold)
	case faultTerminate:
		var pid int
		err := f.pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM (SELECT pid FROM pg_stat_activity
WHERE application_name = $1 ORDER BY random() LIMIT 1) p WHERE pg_terminate_backend(pid)`, relayAppName).Scan(&pid)
		f.note(kind, "backend %d", pid)
		return err
	case faultLockRows:
		return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT coalesce(key, '') || '/' || seq FROM idemq_outbox ORDER BY random() LIMIT $1 FOR UPDATE SKIP LOCKED`, size)
			if err != nil {
				return err
			}
			locked, err := pgx.CollectRows(rows, pgx.RowTo[string])
			f.note(kind, "%v, %s", locked, held)
			time.Sleep(hold)
			return err
		})
	case faultWriter:
		return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			rows, err := enqueueRecorded(ctx, tx, f.ob, historyMessages(size))
			f.note(kind, "wrote %v, %s", rows, held)
			time.Sleep(hold)
			return err
		})
	case faultPrepared, faultRollback:
		rows, err := f.prepare(ctx, gid, size)
		f.note(kind, "%s wrote %v, %s", gid, rows, held)
		if err != nil {
			return err
		}
		time.Sleep(hold)
		end := "COMMIT PREPARED '"
		if kind == faultRollback {
			end = "ROLLBACK PREPARED '"
		}
		_, err = f.pool.Exec(ctx, end+gid+"'")
		return err
	case faultReplay:
		return pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
			n, err := f.ob.ReplayTx(ctx, tx, outbox.DeadFilter{Limit: size, All: true})
			f.note(kind, "%d dead letters, %s", n, held)
			time.Sleep(hold)
			return err
		})
	case faultPurge:
		purged, err := purgeRecorded(ctx, f.pool, f.ob, size, hold)
		f.note(kind, "%v, %s", purged, held)
		return err
	}
	return nil
}

// prepare enqueues size messages in a transaction and prepares it as gid.
func (f *faults) prepare(ctx context.Context, gid string, size int) ([]string, error) {
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := enqueueRecorded(ctx, tx, f.prepared, historyMessages(size))
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	// The session is out of the transaction once it is prepared; pgx's tx
	// is left behind unused.
	_, err = conn.Exec(ctx, "PREPARE TRANSACTION '"+gid+"'")
	return rows, err
}

// note adds a line to the timeline.
func (f *faults) note(kind fault, format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timeline = append(f.timeline, time.Now().UTC().Format("15:04:05.000")+" "+string(kind)+" "+fmt.Sprintf(format, args...))
}

// blame says, for the rows that report's Reordered violations name as
// overtaken, which faults had touched each (in the order of the
// timeline), with a few of the rows: where to look first.
func (f *faults) blame(report history.Report) string {
	rows := map[string][]string{}
	seen := map[string]bool{}
	for _, v := range report.Violations {
		row := fmt.Sprintf("%s/%d", v.Key, v.Seqs[len(v.Seqs)-1])
		if v.Kind != history.Reordered || seen[row] {
			continue
		}
		seen[row] = true
		var by []string
		for _, line := range f.timeline {
			words := strings.FieldsFunc(line, func(r rune) bool { return strings.ContainsRune(" [],", r) })
			if slices.Contains(words[2:], row) && !slices.Contains(by, words[1]) {
				by = append(by, words[1])
			}
		}
		if by == nil {
			by = []string{"no fault"}
		}
		rows[strings.Join(by, "+")] = append(rows[strings.Join(by, "+")], row)
	}
	var parts []string
	for _, by := range slices.Sorted(maps.Keys(rows)) {
		parts = append(parts, fmt.Sprintf("%s %d %v", by, len(rows[by]), rows[by][:min(5, len(rows[by]))]))
	}
	return "overtaken rows by the fault that touched them: " + strings.Join(parts, ", ")
}

// counts says how many faults of each kind ran.
func (f *faults) counts() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for _, k := range faultKinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, f.count[k]))
	}
	return strings.Join(parts, ", ")
}

// historyKeys is the number of ordering keys; each key always goes to the
// same destination (so order per key and per destination and key agree).
const historyKeys = 40

// historyMessages returns n messages over random keys, one in ten
// unkeyed.
func historyMessages(n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		k := rand.IntN(historyKeys)
		m := outbox.Message{ID: uuid.Must(uuid.NewV7()), Destination: fmt.Sprint("d", k%2), Key: fmt.Sprint("k", k)}
		if rand.IntN(10) == 0 {
			m.Key = ""
		}
		m.Payload = []byte(m.ID.String())
		msgs[i] = m
	}
	return msgs
}
