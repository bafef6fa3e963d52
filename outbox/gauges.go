package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/outboxsql"
)

// GaugeSample is the number of rows, oldest first, that [Outbox.Gauges]
// reads through the primary key: below it every figure is exact; above it
// depths are estimates and per-destination ages and held counts describe
// the oldest GaugeSample rows, the ones a relay works on next.
//
// Reading the sample is the largest part of a scrape's cost (about 4 ms
// for 1000 rows, 1 ms for 200, on a 10M-row outbox), hence its size.
const GaugeSample = 200

// Gauges is a snapshot of the outbox's backlog and of the relays draining
// it, read from index edges, a bounded slice of the primary key and the
// planner's statistics: its cost does not grow with the backlog (see
// [Outbox.Gauges]).
type Gauges struct {
	// Depth is the number of rows in the outbox: exact when Exact, else an
	// estimate (the planner's row estimate, capped by the span of seqs).
	Depth int64
	// Exact reports that the outbox holds at most GaugeSample rows, so
	// that Depth and every per-destination figure are exact.
	Exact bool
	// OldestAge is the age of the oldest row (lowest seq); zero when the
	// outbox is empty.
	OldestAge time.Duration
	// Enqueued is the last seq the outbox's sequence handed out: a
	// counter of the rows ever enqueued, which never goes back (a
	// rolled-back enqueue counts too; a replayed dead letter keeps its
	// seq and does not). Two snapshots give the enqueue rate, and with
	// the change of Depth the drain rate (see package console).
	Enqueued int64
	// Destinations are the destinations of the oldest GaugeSample rows, by
	// name.
	Destinations []DestinationGauge
	// Partitions are the key partitions the relays lease, and the unkeyed
	// rows as partition -1.
	Partitions []PartitionGauge
	// Relays are the relay workers that registered, alive or not yet
	// forgotten.
	Relays []RelayGauge
}

// DestinationGauge is the backlog of one destination.
type DestinationGauge struct {
	Destination string
	// Depth is its number of rows: exact when Gauges.Exact, else its share
	// of Gauges.Depth by the planner's statistics of the destination
	// column (refreshed by autovacuum's analyze).
	Depth int64
	// OldestAge is the age of its oldest row among the sample.
	OldestAge time.Duration
	// OldestDue is how long its longest-due row among the sample has been
	// due: a relay that keeps up keeps it near zero.
	OldestDue time.Duration
	// Held counts its rows among the sample that are not due, by reason:
	// "parked" (behind a dead letter of their key), "no_route" (no relay
	// route matches the destination), "waiting" (for a retry, or held by
	// its Sink: a webhook endpoint disabled or behind an open breaker).
	Held map[string]int64
}

// PartitionGauge is one key partition: who owns it and how far behind it
// is.
type PartitionGauge struct {
	// Partition is the partition's number, -1 for the unkeyed rows.
	Partition int
	// Owner is the relay worker that leases it; uuid.Nil for nobody (and
	// for the unkeyed rows, which every worker shares).
	Owner uuid.UUID
	// Token is the lease's fencing token: it grows with every change of
	// owner.
	Token int64
	// Cursor is the seq of its oldest row, the next its owner publishes;
	// 0 when it is empty.
	Cursor int64
	// Lag is the age of its oldest row; zero when it is empty.
	Lag time.Duration
}

// RelayGauge is one relay worker's liveness.
type RelayGauge struct {
	Owner uuid.UUID
	// ExpiresAt is when its liveness runs out unless it beats again
	// (every third of relay.Config.LeaseTTL).
	ExpiresAt time.Time
	// Alive reports ExpiresAt in the future.
	Alive bool
}

// Gauges reads the backlog's gauges in one round trip of five statements,
// each of which reads index edges or at most GaugeSample index entries,
// never count(*) over the outbox:
//   - the primary key's two edges: the oldest row, the span of seqs; and
//     the last value of the seq sequence (Enqueued);
//   - the oldest GaugeSample rows by the primary key, grouped by
//     destination: exact figures while the outbox is that small, the
//     rows a relay works on next when it is not;
//   - pg_class and pg_stats: the planner's row estimate and destination
//     frequencies, which autovacuum's analyze keeps fresh (the outbox's
//     analyze threshold is 10,000 rows, migration 0001), for the depths
//     of a large backlog;
//   - one edge of the (partition, seq) index per partition: its cursor
//     and lag;
//   - the relay and lease tables (65 rows).
//
// Call it from a metrics scrape: its cost does not grow with the backlog
// (BenchmarkGauges10M).
func (o *Outbox) Gauges(ctx context.Context) (Gauges, error) {
	b := &pgx.Batch{}
	b.Queue(o.q.GaugeEdges, o.q.Table)
	b.Queue(o.q.GaugeSample, outboxsql.NoRoute, GaugeSample+1)
	b.Queue(o.q.GaugeStats, o.cfg.Schema, o.cfg.Table)
	b.Queue(o.q.GaugePartitions)
	b.Queue(o.q.GaugeRelays)
	var g Gauges
	send := func(db batcher) error {
		res := db.SendBatch(ctx, b)
		var err error
		g, err = readGauges(res)
		if cerr := res.Close(); err == nil {
			err = cerr
		}
		return err
	}
	var err error
	if db, ok := o.db.(batcher); ok {
		err = send(db)
	} else {
		// A handle without batches: one transaction, three more round
		// trips.
		err = pgx.BeginFunc(ctx, o.db, func(tx pgx.Tx) error { return send(tx) })
	}
	if err != nil {
		return Gauges{}, fmt.Errorf("outbox: gauges: %w", err)
	}
	return g, nil
}

// batcher is a handle that sends batches: a pool, a connection, a tx.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// readGauges reads the results of Gauges' batch, in order.
func readGauges(res pgx.BatchResults) (Gauges, error) {
	var g Gauges
	var lo, hi, estimate *int64
	var oldest *float64
	if err := res.QueryRow().Scan(&lo, &oldest, &hi, &estimate, &g.Enqueued); err != nil {
		return g, err
	}
	g.OldestAge = seconds(oldest)
	var sampled int64
	rows, err := res.Query()
	if err != nil {
		return g, err
	}
	var d DestinationGauge
	var age, due *float64
	var parked, unrouted, waiting int64
	if _, err := pgx.ForEachRow(rows, []any{&d.Destination, &d.Depth, &age, &due, &parked, &unrouted, &waiting}, func() error {
		d.OldestAge, d.OldestDue = seconds(age), seconds(due)
		d.Held = map[string]int64{"parked": parked, "no_route": unrouted, "waiting": waiting}
		sampled += d.Depth
		g.Destinations = append(g.Destinations, d)
		return nil
	}); err != nil {
		return g, err
	}
	var common []string
	var freqs []float64
	if err := res.QueryRow().Scan(&common, &freqs); err != nil && err != pgx.ErrNoRows {
		return g, err
	}
	g.Exact = sampled <= GaugeSample
	g.Depth = sampled
	if !g.Exact {
		g.Depth = estimateDepth(sampled, lo, hi, estimate)
		shareDepth(g.Destinations, g.Depth, common, freqs)
	}
	rows, err = res.Query()
	if err != nil {
		return g, err
	}
	var p PartitionGauge
	var owner *uuid.UUID
	var head *int64
	var lag *float64
	if _, err := pgx.ForEachRow(rows, []any{&p.Partition, &owner, &p.Token, &head, &lag}, func() error {
		p.Owner, p.Cursor, p.Lag = uuid.Nil, 0, seconds(lag)
		if owner != nil {
			p.Owner = *owner
		}
		if head != nil {
			p.Cursor = *head
		}
		g.Partitions = append(g.Partitions, p)
		return nil
	}); err != nil {
		return g, err
	}
	rows, err = res.Query()
	if err != nil {
		return g, err
	}
	var r RelayGauge
	_, err = pgx.ForEachRow(rows, []any{&r.Owner, &r.ExpiresAt, &r.Alive}, func() error {
		g.Relays = append(g.Relays, r)
		return nil
	})
	return g, err
}

// estimateDepth is the depth of an outbox with more rows than the sample:
// the planner's estimate, capped by the span of seqs (which counts every
// row between the edges, drained ones too), and never below the sample.
func estimateDepth(sampled int64, lo, hi, estimate *int64) int64 {
	var span int64
	if lo != nil && hi != nil {
		span = *hi - *lo + 1
	}
	depth := span
	if estimate != nil && (span == 0 || *estimate < span) {
		depth = *estimate
	}
	return max(depth, sampled)
}

// shareDepth sets each destination's depth to its share of depth by the
// planner's most common values; the destinations the statistics do not
// list share the rest by their counts in the sample.
func shareDepth(ds []DestinationGauge, depth int64, common []string, freqs []float64) {
	freq := map[string]float64{}
	rest := 1.0
	for i, v := range common {
		if i < len(freqs) {
			freq[v] = freqs[i]
			rest -= freqs[i]
		}
	}
	var unlisted int64
	for _, d := range ds {
		if _, ok := freq[d.Destination]; !ok {
			unlisted += d.Depth
		}
	}
	for i := range ds {
		sampled := ds[i].Depth
		if f, ok := freq[ds[i].Destination]; ok {
			ds[i].Depth = int64(f * float64(depth))
		} else if unlisted > 0 {
			ds[i].Depth = int64(max(rest, 0) * float64(depth) * float64(sampled) / float64(unlisted))
		}
		ds[i].Depth = max(ds[i].Depth, sampled)
	}
}
