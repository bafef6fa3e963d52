package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/inbox"
	"github.com/idemq/idemq/internal/inboxsql"
	"github.com/idemq/idemq/internal/pgtx"
)

// ProcessBatch applies msgs in one transaction: one statement claims every
// key, the handlers of the new messages run one after the other under one
// savepoint (or the [BatchHandler] once, for all of them), and one commit
// settles them all. If a handler fails, that pass is rolled back and each
// message is applied again under a savepoint of its own, so a failing
// handler rolls back only itself; after the commit it is retried on its
// own as by [Consumer.Process]. A handler may thus run twice for one
// message in one batch, the first time rolled back. results[i] reports
// msgs[i]. A key that appears twice in msgs is applied once: its later
// copies report Duplicate (or the first copy's outcome if that was not
// Applied); a later copy with another payload is processed on its own
// after the commit, and so reported as a Conflict. If the transaction fails
// as a whole (database error, cancelled context), every message not settled
// otherwise is Retry and nothing was committed.
//
// A failed message is retried after the batch commits, that is after the
// later messages of its batch: where per-key order matters and handlers
// fail, use Process, or keep keys that must stay ordered in separate
// batches. A message the database failed (a serialization failure, a
// lost connection: Result.Unavailable) is different: the new messages
// behind it are not applied either, and are Unavailable with it, so that
// none overtakes it.
//
// In leased mode the messages are processed one by one.
func (c *Consumer) ProcessBatch(ctx context.Context, msgs []*Message) []Result {
	if c.tenants != nil {
		return c.tenants.processBatch(ctx, c, msgs)
	}
	start := time.Now()
	results := make([]Result, len(msgs))
	if c.leased != nil {
		for i, msg := range msgs {
			results[i] = c.Process(ctx, msg)
		}
		return results
	}

	var batch, copies []pending
	first := make(map[string]int, len(msgs)) // key -> position in batch
	for i, msg := range msgs {
		key, fingerprint, err := c.identify(msg)
		if err != nil {
			results[i] = c.invalid(ctx, msg, key, err)
			continue
		}
		p := pending{index: i, msg: msg, key: key, fingerprint: fingerprint}
		if _, repeated := first[key]; repeated {
			copies = append(copies, p)
			continue
		}
		first[key] = len(batch)
		batch = append(batch, p)
	}

	ds, err := c.applyBatch(ctx, batch)
	for i, p := range batch {
		switch {
		case err != nil:
			results[p.index] = unavailable(p.key, err)
		case ds[i].failure != nil:
			results[p.index] = c.run(ctx, p.msg, p.key, p.fingerprint, ds[i].failure)
		default:
			results[p.index] = ds[i].result
		}
	}
	for _, p := range copies {
		original := batch[first[p.key]]
		r, alone := copyResult(results[original.index], string(p.fingerprint) == string(original.fingerprint))
		if alone {
			r = c.run(ctx, p.msg, p.key, p.fingerprint, nil)
		}
		results[p.index] = r
	}
	for i := range results {
		results[i] = c.finish(ctx, start, results[i])
	}
	return results
}

// errHeld is the error of a new message of a batch that was not applied
// because the database failed an earlier one: it is Unavailable, and
// waits for that one rather than overtaking it.
var errHeld = errors.New("consumer: held behind an earlier message of the batch that the database failed")

// copyResult is what a later copy of a key in a batch reports, given the
// result of the key's first copy: a copy with the same payload is a
// Duplicate of an Applied first copy and shares any other outcome; a copy
// with another payload is processed alone, after the batch commits.
func copyResult(first Result, samePayload bool) (r Result, alone bool) {
	switch {
	case !samePayload:
		return Result{}, true
	case first.Outcome == Applied:
		return Result{Outcome: Duplicate, Key: first.Key}, false
	}
	return first, false
}

// pending is a message of a batch, the first of its key. The database
// steps fill in claim and err, from which decide settles it.
type pending struct {
	index       int
	msg         *Message
	key         string
	fingerprint []byte
	claim       inboxsql.BatchClaim // what the batch's claim found
	err         error               // what its handler (or its conflict's recording) returned; if not nil, its writes were rolled back
	passed      bool                // settled by applyAll's pass: the per-message path leaves it alone
}

// disposition is what becomes of one message of a batch once the batch's
// transaction commits. decide makes it, so that every rule of the batch
// is in one function that needs no database; applyBatch only carries out
// the writes it names.
type disposition struct {
	// result is what the message reports, unless failure is set.
	result Result
	// unclaim: a database error failed the handler, which says nothing
	// about the message; its claim is undone in the batch, uncounted.
	unclaim bool
	// failure: the handler failed. The batch counts the attempt (and sets
	// failure.failures), and after the commit the message is retried on
	// its own as by Process, which may dead-letter it.
	failure *failure
}

// decide settles every message of a batch, without the database, from
// what its claim found and what its handler (or the recording of its
// conflict) returned: a stored record reports what it holds; a conflict
// is a Conflict once recorded, Retry if recording it failed; a new
// message is Applied (one more attempt than its failures so far) if its
// handler succeeded, Retry with its claim undone if a transient database
// error failed it or it was held behind one (errHeld), and otherwise a
// counted failure. A claim error other than a conflict ends the batch
// before decide.
func decide(batch []pending) []disposition {
	ds := make([]disposition, len(batch))
	for i, p := range batch {
		var conflict *inbox.ConflictError
		isConflict := errors.As(p.claim.Err, &conflict)
		switch {
		case isConflict && p.err != nil:
			ds[i].result = unavailable(p.key, p.err)
		case isConflict:
			ds[i].result = Result{Outcome: Conflict, Key: p.key, Err: conflict}
		case !p.claim.New:
			ds[i].result = existingResult(p.key, p.claim.Existing)
		case p.err == nil:
			ds[i].result = Result{Outcome: Applied, Key: p.key, Attempts: p.claim.Failures + 1}
		case transient(p.err):
			ds[i].result = unavailable(p.key, fmt.Errorf("consumer: database error: %w", p.err))
			ds[i].unclaim = true
		case errors.Is(p.err, errHeld):
			ds[i].result = unavailable(p.key, p.err)
			ds[i].unclaim = true
		default:
			ds[i].failure = &failure{err: p.err}
		}
	}
	return ds
}

// applyBatch runs the batch's transaction: it claims every key, runs the
// handlers (applyAll's pass, then a savepoint per message it left alone),
// writes what decide made of them and commits. On error nothing was
// committed.
func (c *Consumer) applyBatch(ctx context.Context, batch []pending) ([]disposition, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	if err := c.claims.RegisterScope(ctx, c.scope); err != nil {
		return nil, err
	}
	items := make([]inboxsql.Item, len(batch))
	for i, p := range batch {
		items[i] = inboxsql.Item{Key: p.key, Fingerprint: p.fingerprint}
	}
	tx, claims, err := c.claims.BeginClaimBatch(ctx, c.scope, items)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op

	for i := range batch {
		batch[i].claim = claims[i]
	}
	btx := pgtx.NewBatch(tx)
	if err := c.applyAll(ctx, tx, btx, batch); err != nil {
		return nil, err
	}
	// held: the database failed an earlier message of the batch, which
	// is Retry; the new messages behind it wait for it, unapplied, so that
	// none overtakes it (a later message may be of its key).
	held := false
	for i := range batch {
		p := &batch[i]
		if p.passed {
			held = held || transient(p.err)
			continue
		}
		var conflict *inbox.ConflictError
		switch {
		case errors.As(p.claim.Err, &conflict):
		case p.claim.Err != nil:
			return nil, p.claim.Err // identify validated the key: this is a bug, not bad input
		case !p.claim.New:
			continue
		}
		if held {
			p.err = errHeld
			continue
		}
		btx.Next()
		var err error
		switch {
		case conflict != nil:
			err = c.recordConflict(ctx, btx, p.msg, conflict)
		default:
			if err = c.overDelivered(p.msg); err == nil {
				if err = guard("handler", func() error { return c.handler(ctx, btx, p.msg) }); err == nil {
					err = pgtx.Aborted(tx) // the handler swallowed a statement's error
				}
			}
		}
		if rerr := btx.Done(ctx, err != nil); rerr != nil {
			return nil, errors.Join(err, fmt.Errorf("consumer: rollback to savepoint: %w", rerr))
		}
		p.err = err
		held = transient(err) || (conflict != nil && err != nil)
	}
	// A cancelled context or a lost connection is not the handlers'
	// failure: nothing is counted, nothing committed.
	if err := notAFailure(ctx, connLost(tx), nil); err != nil {
		return nil, err
	}
	ds := decide(batch)
	// The failures are counted after the last handler, outside every
	// message's savepoint, and commit with the batch.
	for i, d := range ds {
		switch {
		case d.failure != nil:
			rec, err := c.claims.FailClaimTx(ctx, tx, c.scope, batch[i].key, d.failure.err)
			if err != nil {
				return nil, err
			}
			d.failure.failures = rec.Failures
		case d.unclaim:
			if err := c.claims.UnclaimTx(ctx, tx, c.scope, batch[i].key); err != nil {
				return nil, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("consumer: commit batch: %w", err)
	}
	return ds, nil
}
