package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/inbox"
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
// batches.
//
// In leased mode the messages are processed one by one.
func (c *Consumer) ProcessBatch(ctx context.Context, msgs []*Message) []Result {
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

	if err := c.applyBatch(ctx, batch, results); err != nil {
		for _, p := range batch {
			results[p.index] = retryLater(p.key, err)
		}
	}
	for _, p := range batch {
		if p.failure != nil && results[p.index].Outcome == 0 {
			results[p.index] = c.run(ctx, p.msg, p.key, p.fingerprint, p.failure)
		}
	}
	for _, p := range copies {
		original := batch[first[p.key]]
		switch r := results[original.index]; {
		case string(p.fingerprint) != string(original.fingerprint):
			results[p.index] = c.run(ctx, p.msg, p.key, p.fingerprint, nil)
		case r.Outcome == Applied:
			results[p.index] = Result{Outcome: Duplicate, Key: p.key}
		default:
			results[p.index] = r
		}
	}
	for i := range results {
		results[i] = c.finish(ctx, start, results[i])
	}
	return results
}

// pending is a message of a batch with its key, the first of its key.
type pending struct {
	index       int
	msg         *Message
	key         string
	fingerprint []byte
	failure     *failure // the handler's failure, retried after the commit
	applied     bool     // applied by applyAll's pass
	failures    int      // failed attempts before this batch's claim
}

// applyBatch runs the batch's transaction and fills results of the messages
// it settles; handler failures are left in batch[i].failure. On error
// nothing was committed.
func (c *Consumer) applyBatch(ctx context.Context, batch []pending, results []Result) error {
	if len(batch) == 0 {
		return nil
	}
	if err := c.store.RegisterScope(ctx, c.scope); err != nil {
		return err
	}
	items := make([]inbox.Item, len(batch))
	for i, p := range batch {
		items[i] = inbox.Item{Key: p.key, Fingerprint: p.fingerprint}
	}
	tx, claims, err := c.store.BeginClaimBatch(ctx, c.scope, items)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op

	btx := pgtx.NewBatch(tx)
	stopped, stoppedErr, err := c.applyAll(ctx, tx, btx, batch, claims)
	if err != nil {
		return err
	}
	var failed []*pending
	var undone []string
	// failedWith records the failure of p's handler: a database error is
	// not the message's, its claim is undone uncounted; any other failure
	// is counted with the batch and retried after the commit.
	failedWith := func(p *pending, err error) {
		if transient(err) {
			results[p.index] = retryLater(p.key, fmt.Errorf("consumer: database error: %w", err))
			undone = append(undone, p.key)
			return
		}
		p.failure = &failure{err: err}
		failed = append(failed, p)
	}
	for i := range batch {
		p, claim := &batch[i], claims[i]
		if p.applied || p == stopped { // settled by applyAll
			p.failures = claim.Failures
			if p == stopped {
				failedWith(p, stoppedErr)
			}
			continue
		}
		var conflict *inbox.ConflictError
		switch {
		case errors.As(claim.Err, &conflict):
		case claim.Err != nil:
			return claim.Err // identify validated the key: this is a bug, not bad input
		case !claim.New:
			results[p.index] = existingResult(p.key, claim.Existing)
			continue
		}
		p.failures = claim.Failures

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
			return errors.Join(err, fmt.Errorf("consumer: rollback to savepoint: %w", rerr))
		}
		if err == nil {
			if conflict != nil {
				results[p.index] = Result{Outcome: Conflict, Key: p.key, Err: conflict}
			}
			continue
		}
		if conflict != nil {
			results[p.index] = retryLater(p.key, err)
			continue
		}
		failedWith(p, err)
	}
	// A cancelled context or a lost connection is not the handlers'
	// failure: nothing is counted, nothing committed.
	if err := notAFailure(ctx, tx.Conn(), nil); err != nil {
		return err
	}
	// The failures are counted after the last handler, outside every
	// message's savepoint, and commit with the batch.
	for _, p := range failed {
		rec, err := c.store.FailClaimTx(ctx, tx, c.scope, p.key, p.failure.err)
		if err != nil {
			return err
		}
		p.failure.failures = rec.Failures
	}
	for _, key := range undone {
		if err := c.store.UnclaimTx(ctx, tx, c.scope, key); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: commit batch: %w", err)
	}
	for _, p := range batch {
		if results[p.index].Outcome == 0 && p.failure == nil {
			results[p.index] = Result{Outcome: Applied, Key: p.key, Attempts: p.failures + 1}
		}
	}
	return nil
}
