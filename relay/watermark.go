package relay

import (
	"context"
	"errors"
	"fmt"
)

// Watermark is what a [Watermarker] committed last for one key partition
// of the outbox, in the broker's own transaction: the rows of the
// partition it delivered.
type Watermark struct {
	// Partition is the outbox key partition (0 to 63).
	Partition int
	// Token is the lease token of the relay worker that committed it; 0
	// for none committed yet.
	Token int64
	// Seq is the highest seq the transaction delivered; 0 for none.
	Seq int64
	// Seqs are the seqs of the rows the transaction delivered. Seqs are
	// unique and a row keeps its seq while it waits for a retry, so a row
	// of the partition whose seq is here was delivered.
	Seqs []int64
}

// Watermarker is implemented by a [Sink] that commits every batch of a
// partition as one broker transaction together with a watermark naming the
// rows it delivered, and that fences the partition's previous owner in the
// broker when the lease moves (the transactional Kafka Sink of package
// transports/kafka/franz). A [Router] implements it for the sinks it
// routes to.
//
// A watermark names every row of the partition that the relay batch of
// its transaction delivered: a [Router] publishes a batch in a call per
// destination, so a Watermarker that commits a transaction per call
// accumulates the seqs of the calls of one batch (one [BatchID]).
//
// The relay asks a Watermarker for a partition's watermark whenever a
// worker takes the partition under a new lease token, and again after a
// round or a publish of that partition failed, before it publishes any
// more of the partition's rows. It deletes, without publishing them, the
// partition's rows whose seq the watermark names: rows that a crash or a
// failed database commit left behind after the broker had committed them.
// Together with the Sink's fencing that makes the publish exactly once for
// a consumer of the broker's committed data.
type Watermarker interface {
	// Watermark fences every earlier owner of partition in the broker (a
	// lease token below token), then returns the partition's last
	// committed watermark. Later Publish calls carry token in
	// Message.LeaseToken.
	Watermark(ctx context.Context, partition int, token int64) (Watermark, error)
}

// Watermark returns the union of the watermarks of the routed sinks that
// are Watermarkers (a row is delivered by one destination's sink; seqs are
// unique across sinks). It lets a relay whose Sink is a Router apply the
// watermarks of its transactional sinks.
func (r *Router) Watermark(ctx context.Context, partition int, token int64) (Watermark, error) {
	out := Watermark{Partition: partition}
	if r == nil {
		return out, nil
	}
	sinks := make([]Sink, 0, len(r.exact)+len(r.prefixes))
	for _, s := range r.exact {
		sinks = append(sinks, s)
	}
	for _, p := range r.prefixes {
		sinks = append(sinks, p.sink)
	}
	var errs []error
	for _, s := range sinks {
		wm, ok := s.(Watermarker)
		if !ok {
			continue
		}
		m, err := wm.Watermark(ctx, partition, token)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.Token = max(out.Token, m.Token)
		out.Seq = max(out.Seq, m.Seq)
		out.Seqs = append(out.Seqs, m.Seqs...)
	}
	return out, errors.Join(errs...)
}

var _ Watermarker = (*Router)(nil)

// errWatermark is matched by the error of a round whose Sink could not
// give a partition's watermark.
var errWatermark = errors.New("relay: the Sink's watermark")

// watermarks applies the Sink's watermark of every partition the worker
// owns under a token it has not applied yet: it deletes the rows the
// Sink's last committed transaction delivered. Deleting a delivered row is
// right whoever does it, so this needs no fence.
func (w *worker) watermarks(ctx context.Context) error {
	wm, ok := w.r.sink.(Watermarker)
	if !ok {
		return nil
	}
	if w.marked == nil {
		w.marked = map[int32]int64{}
	}
	for _, l := range w.leases {
		if t, ok := w.marked[l.part]; ok && t == l.token {
			continue
		}
		m, err := wm.Watermark(ctx, int(l.part), l.token)
		if err != nil {
			return fmt.Errorf("%w of partition %d: %w", errWatermark, l.part, err)
		}
		if len(m.Seqs) > 0 {
			tag, err := w.r.pool.Exec(ctx, w.r.sql.Delivered, l.part, m.Seqs)
			if err != nil {
				return fmt.Errorf("relay: delete the rows partition %d's watermark names: %w", l.part, err)
			}
			if n := tag.RowsAffected(); n > 0 {
				w.r.log.Info("relay: deleted rows the sink had committed already", "partition", l.part, "rows", n, "watermark_seq", m.Seq, "watermark_token", m.Token)
			}
		}
		w.marked[l.part] = l.token
	}
	return nil
}

// unmark makes the worker apply the watermarks of the partitions of the
// messages whose publish failed (all of them for a nil rows) again before
// it publishes more of them: the Sink's transaction may have committed
// though the Sink could not say so.
func (w *worker) unmark(rows []row, failed map[int]error) {
	if rows == nil {
		w.marked = nil
		return
	}
	for i, err := range failed {
		if err != nil && !errors.Is(err, ErrSkipped) && i < len(rows) {
			delete(w.marked, int32(rows[i].msg.Partition))
		}
	}
}
