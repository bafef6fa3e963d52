package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/idemq/idemq/outbox"
)

// The outbox's sequence. The horizon and the cursors are seqs, so they
// hold only while the sequence hands out values in order and never goes
// back. The relay refuses to start when it does not (preflight, with
// outbox.Outbox.CheckSequence), and every horizon read checks again; a
// worker reads the horizon at least every second for that, also while its
// scans do not reach it, and every scan reads the file nodes after its
// window, in the same round trip:
//
//   - CACHE above 1 (set while the relay runs) ends Run with the ALTER
//     TABLE that fixes it;
//   - a new file node of the sequence (ALTER SEQUENCE ... RESTART, ALTER
//     TABLE ... ALTER COLUMN seq RESTART, TRUNCATE ... RESTART IDENTITY:
//     seen however many values were drawn since), a last value below the
//     highest one the worker read (setval), or a new file node of the
//     table (TRUNCATE, VACUUM FULL, CLUSTER): the worker drops the window
//     it read, checks the sequence against the seqs in use as at start
//     (rows or dead letters above its last value end Run with the setval
//     that fixes it, since new rows would go before them in their keys'
//     order), forgets its cursors and horizon, which may lie ahead of
//     every new row, and reads from the start.

// sequenceWatch is what a worker remembers of the outbox's sequence and
// table between horizon reads.
type sequenceWatch struct {
	high    int64     // the highest last value read
	node    int64     // the table's file node; 0 before the first read
	seqNode int64     // the sequence's file node; 0 before the first read
	at      time.Time // when it was read
	moved   bool      // a change was seen and not yet checked
}

// due reports whether the sequence is due for a check, a second after the
// last one.
func (s *sequenceWatch) due() bool { return time.Since(s.at) >= time.Second }

// watchSequence checks a horizon read: top, the sequence's last value;
// node, the table's file node; cache, the sequence's CACHE; seqNode, the
// sequence's file node.
func (w *worker) watchSequence(top, node, cache, seqNode int64) error {
	if cache > 1 {
		return outbox.SequenceCheck{Sequence: "the outbox's sequence", Cache: cache, Table: w.r.sql.Table}.Err()
	}
	w.watch(top, node, seqNode)
	w.seqs.at = time.Now()
	return nil
}

// watch compares the sequence's last value top and the file nodes of the
// table and the sequence with what the worker saw before. After a change
// it drops what it knew of the seqs and marks the sequence for a check,
// which also drops the window the round read. Every scan reads the nodes
// again (outboxsql's Nodes, with top the highest value seen), so that no
// window holding rows of a new run of the sequence is ever claimed.
func (w *worker) watch(top, node, seqNode int64) {
	s := &w.seqs
	tableNew, seqNew := s.node != 0 && node != s.node, s.seqNode != 0 && seqNode != s.seqNode
	if tableNew || seqNew || top < s.high {
		w.r.log.Warn("relay: the outbox was truncated or rewritten, or its sequence restarted; reading it from the start",
			"last_value", top, "was", s.high, "filenode_changed", tableNew, "sequence_restarted", seqNew)
		w.win.reset()
		s.high, s.moved = 0, true
	}
	s.high, s.node, s.seqNode = max(s.high, top), node, seqNode
}

// checkSequence checks the sequence against the seqs in use after a
// change, on the round's connection, and returns the error that ends Run
// when new rows would go before older ones of their keys.
func (w *worker) checkSequence(ctx context.Context, tx *claimTx) error {
	r := w.r
	c := outbox.SequenceCheck{Table: r.sql.Table}
	if err := tx.conn.QueryRow(ctx, r.sql.SequenceState, r.sql.Table).Scan(&c.Sequence, &c.Cache, &c.LastValue, &c.HighestSeq); err != nil {
		return fmt.Errorf("relay: check the sequence: %w", err)
	}
	if err := c.Err(); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	w.seqs.moved = false
	return nil
}
