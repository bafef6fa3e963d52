package relay

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/outboxsql"
)

// Partition leases (the tables of the outbox's migration 0002; statements
// in internal/outboxsql):
//
//   - Every worker of every relay is a member with its own id: it upserts
//     its row in the relays table when it rebalances, the relay's
//     heartbeat keeps it alive every LeaseTTL/3, and a worker that stops
//     deletes it and gives up its partitions.
//   - Between batches, at most every LeaseTTL/10 (at once when a batch saw
//     that it owns too many), a worker rebalances: with n live members it
//     wants ceil(Partitions/n) partitions, gives up the ones above that
//     and takes missing ones among those nobody owns or whose owner is
//     dead (its row expired), skipping those locked by a batch in flight.
//     A take bumps the lease's token.
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
	switch {
	case len(held) > target:
		extra := make([]int32, 0, len(held)-target)
		for _, l := range held[target:] {
			extra = append(extra, l.part)
		}
		if _, err := r.pool.Exec(ctx, r.sql.Release, w.id, extra); err != nil {
			return err
		}
		held = held[:target]
	case len(held) < target:
		rows, err := r.pool.Query(ctx, r.sql.Take, w.id, target-len(held))
		if err != nil {
			return err
		}
		taken, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (lease, error) {
			var l lease
			err := row.Scan(&l.part, &l.token, &l.gen)
			return l, err
		})
		if err != nil {
			return err
		}
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
	for _, l := range held {
		if !slices.Contains(w.leases, l) {
			w.restart()
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
	i, _ := slices.BinarySearch(parts, w.next)
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

// heartbeatLoop keeps the workers ids alive until ctx is done.
func (r *Relay) heartbeatLoop(ctx context.Context, ids []uuid.UUID) {
	t := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.pool.Exec(ctx, r.sql.Beat, ids, r.cfg.LeaseTTL.Microseconds()); err != nil && ctx.Err() == nil {
			r.log.Warn("relay heartbeat failed", "err", err)
		}
	}
}
