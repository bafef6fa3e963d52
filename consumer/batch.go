package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemq/idemq/inbox"
)

// ProcessBatch applies msgs in one transaction: one statement claims every
// key, each handler runs under its own savepoint, and one commit settles
// them all. A failing handler rolls back only itself; after the commit it
// is retried on its own as by [Consumer.Process]. results[i] reports
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
			results[p.index] = c.run(ctx, p.msg, p.key, p.fingerprint, 1, p.failure)
		}
	}
	for _, p := range copies {
		original := batch[first[p.key]]
		switch r := results[original.index]; {
		case string(p.fingerprint) != string(original.fingerprint):
			results[p.index] = c.run(ctx, p.msg, p.key, p.fingerprint, 0, nil)
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
	failure     error // the handler's error, retried after the commit
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
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: begin batch: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit a no-op
	items := make([]inbox.Item, len(batch))
	for i, p := range batch {
		items[i] = inbox.Item{Key: p.key, Fingerprint: p.fingerprint}
	}
	claims, err := c.store.ClaimBatch(ctx, tx, c.scope, items)
	if err != nil {
		return err
	}

	btx := &batchTx{handlerTx: handlerTx{tx}}
	var failed []string
	for i := range batch {
		p, claim := &batch[i], claims[i]
		var conflict *inbox.ConflictError
		switch {
		case errors.As(claim.Err, &conflict):
			if c.cfg.DeadLetter == nil {
				results[p.index] = Result{Outcome: Conflict, Key: p.key, Err: conflict}
				continue
			}
		case claim.Err != nil:
			return claim.Err // identify validated the key: this is a bug, not bad input
		case !claim.New:
			results[p.index] = existingResult(p.key, claim.Existing)
			continue
		}

		btx.next()
		var err error
		if conflict != nil {
			err = c.cfg.DeadLetter(ctx, btx, p.msg, conflict)
		} else {
			err = guard("handler", func() error { return c.handler(ctx, btx, p.msg) })
		}
		if rerr := btx.done(ctx, err != nil); rerr != nil {
			return errors.Join(err, fmt.Errorf("consumer: rollback to savepoint: %w", rerr))
		}
		if err == nil {
			if conflict != nil {
				results[p.index] = Result{Outcome: Conflict, Key: p.key, Err: conflict}
			}
			continue
		}
		if conflict != nil {
			results[p.index] = retryLater(p.key, fmt.Errorf("consumer: dead-letter hook for a conflict: %w", err))
			continue
		}
		p.failure = err
		failed = append(failed, p.key)
	}
	if err := c.store.Unclaim(ctx, tx, c.scope, failed); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: commit batch: %w", err)
	}
	for _, p := range batch {
		if results[p.index].Outcome == 0 && p.failure == nil {
			results[p.index] = Result{Outcome: Applied, Key: p.key, Attempts: 1}
		}
	}
	return nil
}
