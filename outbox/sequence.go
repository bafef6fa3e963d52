package outbox

import (
	"context"
	"errors"
	"fmt"
)

// ErrSequence is matched (with errors.Is) by the error of
// [SequenceCheck.Err]: the sequence of the outbox's seq column is in a
// state that breaks the relay's per-key order.
var ErrSequence = errors.New("outbox: the seq sequence breaks per-key order")

// SequenceCheck is the state of the sequence that numbers the outbox's
// rows. The relay orders a key's messages by seq and reads the outbox up
// to the sequence's last value once every writer that could draw a smaller
// one has ended, which holds only while the sequence hands out values in
// order (CACHE 1, the default) and never goes back below the seqs in use.
type SequenceCheck struct {
	// Sequence is the sequence's name, schema-qualified.
	Sequence string
	// Cache is its CACHE setting.
	Cache int64
	// LastValue is the last value it handed out, 0 for none.
	LastValue int64
	// HighestSeq is the highest seq among the outbox's rows and its dead
	// letters (which keep their seq), 0 for none.
	HighestSeq int64
	// Table is the outbox table, schema-qualified and quoted.
	Table string
}

// Err returns nil for a sequence the relay can work with, or an error
// matching [ErrSequence] that says what to run: for a CACHE above 1, which
// hands sessions values out of order, and for a sequence below the seqs in
// use (restarted, as TRUNCATE ... RESTART IDENTITY does), behind which new
// messages would be published before older ones of their key.
func (s SequenceCheck) Err() error {
	switch {
	case s.Cache > 1:
		return fmt.Errorf("%w: %s has CACHE %d, so sessions hand out seqs out of order: run ALTER TABLE %s ALTER COLUMN seq SET CACHE 1",
			ErrSequence, s.Sequence, s.Cache, s.Table)
	case s.HighestSeq > s.LastValue:
		return fmt.Errorf("%w: %s is at %d, below seq %d of a message or dead letter (was it restarted, by TRUNCATE ... RESTART IDENTITY?): run SELECT setval('%s', %d)",
			ErrSequence, s.Sequence, s.LastValue, s.HighestSeq, s.Sequence, s.HighestSeq)
	}
	return nil
}

// CheckSequence reads the state of the outbox's seq sequence; see
// [SequenceCheck.Err]. It reads the highest seq from the ends of the two
// tables' primary keys, not the tables.
func (o *Outbox) CheckSequence(ctx context.Context) (SequenceCheck, error) {
	s := SequenceCheck{Table: o.q.Table}
	if err := o.db.QueryRow(ctx, o.q.SequenceState, o.q.Table).Scan(&s.Sequence, &s.Cache, &s.LastValue, &s.HighestSeq); err != nil {
		return SequenceCheck{}, fmt.Errorf("outbox: check the seq sequence: %w", err)
	}
	return s, nil
}
