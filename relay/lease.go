package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/outboxsql"
)

// Partition leases (the tables of the outbox's migration 0002; statements
// in internal/outboxsql):
//
//   - Every worker of every relay is a member with its own id: it upserts
//     its row in the relays table when it rebalances, the relay's
//     heartbeat registers every worker at start and keeps them alive
//     every LeaseTTL/3 on a connection of its own (never behind the
//     batches), and a worker that stops deletes its row and gives up its
//     partitions.
//   - Between batches, at most every LeaseTTL/10 (at once when a batch saw
//     that it owns too many), a worker rebalances: with n live members it
//     wants ceil(Partitions/n) partitions, gives up the ones above that
//     and takes missing ones among those nobody owns or whose owner is
//     dead (its row expired), skipping those locked by a batch in flight.
//     A take bumps the lease's token. Giving up and taking skip the
//     partitions a dead-letter operation holds (outbox ReplayTx, PurgeTx,
//     RetryNow bump their gens): such a transaction, left open, never
//     stops a worker. The partitions it holds stay with their owners
//     meanwhile; those of a dead owner wait for it to end (an unkeyed
//     replay holds every partition), the others change hands as usual.
//   - Every batch locks the lease rows of its worker FOR SHARE and checks
//     their tokens and gens before it scans. A takeover cannot commit
//     while a stale owner's batch is in flight, and once it has, the stale
//     owner's next batch sees the token change and claims nothing.

// lease is a partition a worker owns.
type lease struct {
	part       int32
	token, gen int64
}

// rebalance registers the worker as alive, counts the live workers and
// takes or gives up partitions to own its share.
func (w *worker) rebalance(ctx context.Context) error {
	r := w.r
	ttl := r.cfg.LeaseTTL.Microseconds()
	if _, err := r.pool.Exec(ctx, r.sql.Join, []uuid.UUID{w.id}, ttl); err != nil {
		return err
	}
	var live int
	var parts []int32
	var tokens, gens []int64
	if err := r.pool.QueryRow(ctx, r.sql.Live, w.id).Scan(&live, &parts, &tokens, &gens); err != nil {
		return err
	}
	held := make([]lease, len(parts))
	for i := range parts {
		held[i] = lease{parts[i], tokens[i], gens[i]}
	}
	w.live = max(live, 1)
	target := w.target()
	if len(held) <= target {
		w.stuck = false
	}
	switch {
	case len(held) > target:
		extra := make([]int32, 0, len(held)-target)
		for _, l := range held[target:] {
			extra = append(extra, l.part)
		}
		rows, err := r.pool.Query(ctx, r.sql.Release, w.id, extra)
		if err != nil {
			return err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		r.mon.released(w.id, gone)
		// A partition a dead-letter operation holds is not given up (see
		// Release): the worker keeps serving it and tries again at its
		// next rebalance, not at once.
		if stuck := len(gone) < len(extra); stuck != w.stuck {
			w.stuck = stuck
			if stuck {
				r.log.Info("relay: a dead-letter operation holds partitions this worker gives up; it keeps serving them until the operation ends",
					"worker", w.id, "kept", len(extra)-len(gone))
			}
		}
		held = slices.DeleteFunc(held, func(l lease) bool { return slices.Contains(gone, l.part) })
		w.leases = slices.DeleteFunc(w.leases, func(l lease) bool { return slices.Contains(gone, l.part) })
	case len(held) < target:
		rows, err := r.pool.Query(ctx, r.sql.Take, w.id, target-len(held))
		if err != nil {
			return err
		}
		var from []*uuid.UUID // previous owners
		taken, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lease, error) {
			var l lease
			var prev *uuid.UUID
			err := row.Scan(&l.part, &l.token, &l.gen, &prev)
			from = append(from, prev)
			return l, err
		})
		if err != nil {
			return err
		}
		r.mon.acquired(w.id, taken, from)
		held = append(held, taken...)
	}
	w.setLeases(held)
	w.rebalanceAt = time.Now().Add(r.cfg.LeaseTTL / 10)
	return nil
}

// target is the number of partitions this worker wants.
func (w *worker) target() int {
	return (outboxsql.Partitions + w.live - 1) / w.live
}

// setLeases records the partitions the worker owns. A partition it did not
// own before under the same token, or whose gen changed, may hold rows
// anywhere: the worker then forgets what it knew and scans from the start.
func (w *worker) setLeases(held []lease) {
	slices.SortFunc(held, func(a, b lease) int { return int(a.part - b.part) })
	w.r.mon.lost(w.id, w.leases, held)
	for _, l := range held {
		if !slices.Contains(w.leases, l) {
			w.win.restart()
			break
		}
	}
	w.leases = held
}

// token is the fencing token of the worker's lease on part; 0 for the
// unkeyed rows (-1), which no lease covers.
func (w *worker) token(part int32) int64 {
	i, ok := slices.BinarySearchFunc(w.leases, part, func(l lease, p int32) int { return cmp.Compare(l.part, p) })
	if !ok {
		return 0
	}
	return w.leases[i].token
}

// partitions are the partitions the next scan reads, in order: -1 (the
// unkeyed rows) and the owned ones, from w.next on, round.
func (w *worker) partitions() []int32 {
	parts := make([]int32, 0, len(w.leases)+1)
	parts = append(parts, -1)
	for _, l := range w.leases {
		parts = append(parts, l.part)
	}
	i, _ := slices.BinarySearch(parts, w.win.next)
	return slices.Concat(parts[i:], parts[:i])
}

// leave gives up the worker's partitions and deletes its row, so that the
// other workers take over at once instead of after LeaseTTL.
func (w *worker) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := w.r.pool.Exec(ctx, w.r.sql.Leave, w.id); err != nil {
		w.r.log.Warn("relay worker could not give up its partitions; they are taken after LeaseTTL", "err", err)
	}
}

// joinAll opens the heartbeat's pool and registers the relay's workers.
// The heartbeat has a pool of one connection of its own, with the work
// pool's settings: renewals must never wait behind batches that hold the
// work pool's connections while a Sink publishes, or a busy relay would
// lose its live workers' partitions. Registering every worker before any
// rebalances lets each count all of its relay's workers at once, so that
// none takes more than its share only to give it up again.
func (r *Relay) joinAll(ctx context.Context, ids []uuid.UUID) (*pgxpool.Pool, error) {
	cfg := r.pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	beats, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := r.beat(ctx, beats, r.sql.Join, ids); err != nil {
		beats.Close()
		return nil, fmt.Errorf("relay: register the workers: %w", err)
	}
	return beats, nil
}

// heartbeat keeps the workers ids alive, one beat per call, for
// lifecycle.KeepAlive to run every LeaseTTL/3 until ctx is done. A failed
// beat is logged and tried again at the next tick; the fence, not the
// heartbeat, stops the workers once their leases may have run out.
func (r *Relay) heartbeat(ctx context.Context, beats *pgxpool.Pool, ids []uuid.UUID) func(context.Context) error {
	return func(bctx context.Context) error {
		err := r.beat(bctx, beats, r.sql.Beat, ids)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("relay heartbeat failed; the workers stop publishing once their leases may have run out", "err", err, "lease_ttl", r.cfg.LeaseTTL)
		}
		return err
	}
}

// beat runs stmt (Join or Beat) for the workers ids on the heartbeat's
// pool. Once it succeeded, the workers' leases run until LeaseTTL after it
// was sent, at the earliest: the server set their expiry from a later
// clock reading. A beat that takes longer than LeaseTTL/3 is given up, so
// the next one starts on a fresh connection.
func (r *Relay) beat(ctx context.Context, beats *pgxpool.Pool, stmt string, ids []uuid.UUID) error {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/3)
	defer cancel()
	if _, err := beats.Exec(ctx, stmt, ids, r.cfg.LeaseTTL.Microseconds()); err != nil {
		return err
	}
	until := sent.Add(r.cfg.LeaseTTL)
	r.alive.Store(&until)
	return nil
}

// Fencing a batch. A successor may take over a partition once the owner's
// row in the relays table has expired (no heartbeat for LeaseTTL) and the
// owner's batch transaction, which holds the lease row FOR SHARE, has
// ended. A batch whose owner stalled (a pause, a network that holds its
// packets) ends on the server: idle_in_transaction_session_timeout is
// fenceTimeout, and it runs from the end of the claim, so not before
// fenceTimeout after the claim was sent. The owner, on its side, starts no
// publish, and gives its Sink no time, past the earlier of PublishTimeout
// after it sent the claim and the moment its leases may have run out;
// the commit has the rest of fenceTimeout. So an owner never publishes
// after the moment its successor may start, however late the claim's
// answer arrives.

// errFenced is the error of a batch that did not publish because its
// owner may have been succeeded. It matches idemq.ErrLeaseLost: the
// partition leases are fenced leases like every other in idemq.
var errFenced = fmt.Errorf("relay: the batch's claim is fenced off: %w", idemq.ErrLeaseLost)

// fenceTimeout is the server's bound on a batch transaction left idle:
// PublishTimeout for the Sink and a heartbeat period (LeaseTTL/3) for the
// commit's round trip.
func (r *Relay) fenceTimeout() time.Duration {
	return r.cfg.PublishTimeout + r.cfg.LeaseTTL/3
}

// fence returns the context a Sink publishes the rows of a claim sent at
// sent in: it ends PublishTimeout after sent, or earlier once the
// workers' leases may have run out. It returns errFenced, and the batch
// publishes nothing, when either moment has passed already. done releases
// the context and returns errFenced if the leases ran out meanwhile: the
// batch must then roll back, without counting an attempt.
func (r *Relay) fence(work context.Context, sent time.Time) (ctx context.Context, done func() error, err error) {
	end := sent.Add(r.cfg.PublishTimeout)
	now := time.Now()
	switch alive := r.alive.Load(); {
	case !now.Before(end):
		return nil, nil, fmt.Errorf("%w: its answer came %v after it was sent, past PublishTimeout; the rows are left to whoever owns their partitions now", errFenced, now.Sub(sent))
	case alive == nil || !now.Before(*alive):
		return nil, nil, r.lapsed()
	}
	deadline, cancel := context.WithDeadline(work, end)
	ctx, lapse := context.WithCancelCause(deadline)
	go func() {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			t.Reset(time.Until(*r.alive.Load()))
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !time.Now().Before(*r.alive.Load()) {
				lapse(r.lapsed())
				return
			}
		}
	}()
	return ctx, func() error {
		err := context.Cause(ctx)
		lapse(nil)
		cancel()
		if errors.Is(err, errFenced) {
			return err
		}
		return nil
	}, nil
}

// lapsed is the error of a batch whose leases may have run out.
func (r *Relay) lapsed() error {
	return fmt.Errorf("%w: no heartbeat for LeaseTTL (%v); the rows are left to whoever owns their partitions now", errFenced, r.cfg.LeaseTTL)
}
