package relay

import (
	"time"

	"github.com/idemq/idemq/outbox"
)

// The outbox's sequence. The horizon and the cursors are seqs, so they
// hold only while the sequence hands out values in order and never goes
// back. The relay refuses to start when it does not (preflight, with
// outbox.Outbox.CheckSequence), and every horizon read checks again; a
// worker reads the horizon at least every second for that, also while its
// scans do not reach it:
//
//   - CACHE above 1 (set while the relay runs) ends Run with the ALTER
//     TABLE that fixes it;
//   - a last value below the highest one the worker read, or a new file
//     node of the table, means TRUNCATE (RESTART IDENTITY restarts the
//     sequence) or a rewrite (VACUUM FULL, CLUSTER): the worker forgets its
//     cursors and horizon, which may lie ahead of every new row, and reads
//     from the start.

// sequenceWatch is what a worker remembers of the outbox's sequence and
// table between horizon reads.
type sequenceWatch struct {
	high int64     // the highest last value read
	node int64     // the table's file node; 0 before the first read
	at   time.Time // when it was read
}

// due reports whether the sequence is due for a check, a second after the
// last one.
func (s *sequenceWatch) due() bool { return time.Since(s.at) >= time.Second }

// watchSequence checks a horizon read: top, the sequence's last value;
// node, the table's file node; cache, the sequence's CACHE.
func (w *worker) watchSequence(top, node, cache int64) error {
	if cache > 1 {
		return outbox.SequenceCheck{Sequence: "the outbox's sequence", Cache: cache, Table: w.r.sql.Table}.Err()
	}
	s := &w.seqs
	if (s.node != 0 && node != s.node) || top < s.high {
		w.r.log.Warn("relay: the outbox was truncated or rewritten, or its sequence restarted; reading it from the start",
			"last_value", top, "was", s.high, "filenode_changed", s.node != node)
		w.restart()
		w.horizon, w.seen, w.pending = 0, 0, nil
		s.high = 0
	}
	s.high, s.node, s.at = max(s.high, top), node, time.Now()
	return nil
}
