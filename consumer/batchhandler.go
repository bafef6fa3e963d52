package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemq/idemq"
	"github.com/idemq/idemq/internal/pgtx"
)

// BatchHandler applies many messages in one call inside tx, the
// transaction that also records them in the inbox, so that their writes can
// go out as one statement (a multi-row INSERT ... SELECT FROM unnest, or
// CopyFrom) instead of a round trip per message. msgs holds only messages
// new to the inbox: duplicates, conflicts and dead letters are filtered out
// before the call. It must not commit or roll back tx; returning an error
// rolls back what it wrote, after which the consumer applies the same
// messages one by one (calling it with one message each) so that a poison
// message fails alone.
type BatchHandler func(ctx context.Context, tx pgx.Tx, msgs []*Message) error

// NewBatched returns a transactional Consumer whose handler takes a whole
// batch: [Consumer.ProcessBatch] calls it once for every message of the
// batch that is new, and [Consumer.Process] calls it with one message.
// Outcomes, retries and dead letters are those of [New]: a batch that fails
// is applied again message by message, and only those failures count as
// attempts.
func NewBatched(pool *pgxpool.Pool, scope string, handler BatchHandler, cfg Config) (*Consumer, error) {
	if handler == nil {
		return nil, idemq.NewConfigError(component, "handler", "is nil")
	}
	return newConsumer(pool, scope, cfg, func(c *Consumer) {
		c.batch = handler
		c.handler = func(ctx context.Context, tx pgx.Tx, msg *Message) error {
			return handler(ctx, tx, []*Message{msg})
		}
	})
}

// applyAll applies the messages of batch that their claims found new in
// one pass under one savepoint, so that a batch without failures pays for
// one savepoint, not one per message. It marks the messages it settles as
// passed (with their handler's error); the others go the per-message path,
// each under a savepoint of its own.
//
// With a BatchHandler the pass is one call; if it fails, its writes are
// rolled back and every message goes the per-message path (one call each),
// which finds the failures: the failed call is no message's attempt. With
// a per-message handler the pass stops at the first failure, which is
// that message's attempt; the messages before it are applied again in one
// pass (their first writes were rolled back with the failure's), and
// those after it go the per-message path. A failing handler thus runs
// once per attempt; a handler that succeeded before it may run twice, the
// first time rolled back. err ends the batch.
func (c *Consumer) applyAll(ctx context.Context, tx pgx.Tx, btx *pgtx.Batch, batch []pending) error {
	var pass []*pending
	for i := range batch {
		if p := &batch[i]; p.claim.Err == nil && p.claim.New && c.overDelivered(p.msg) == nil {
			pass = append(pass, p)
		}
	}
	if len(pass) < 2 {
		return nil // the per-message path makes the same single call
	}
	failedAt, handlerErr, err := c.pass(ctx, tx, btx, pass)
	switch {
	case err != nil:
		return err
	case handlerErr == nil:
		markApplied(pass)
		return nil
	case c.batch != nil:
		c.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "batch handler failed, applying its messages one by one",
			slog.String("scope", c.scope), slog.Int("messages", len(pass)), slog.Any("error", handlerErr))
		return nil
	}
	pass[failedAt].passed, pass[failedAt].err = true, handlerErr
	if failedAt == 0 {
		return nil
	}
	if _, again, err := c.pass(ctx, tx, btx, pass[:failedAt]); err != nil || again != nil {
		// A handler that failed only now: the per-message path sorts it out.
		return err
	}
	markApplied(pass[:failedAt])
	return nil
}

// markApplied marks the messages of a pass that succeeded as passed,
// without error.
func markApplied(pass []*pending) {
	for _, p := range pass {
		p.passed, p.err = true, nil
	}
}

// pass applies msgs under one savepoint, rolled back if a handler fails:
// with the batch handler in one call, or with the handler message after
// message up to the first failure, at failedAt. err is set if the context
// ended, the connection was lost or the rollback failed.
func (c *Consumer) pass(ctx context.Context, tx pgx.Tx, btx *pgtx.Batch, msgs []*pending) (failedAt int, handlerErr, err error) {
	btx.Next()
	handlerErr = guard("handler", func() error {
		if c.batch != nil {
			all := make([]*Message, len(msgs))
			for i, p := range msgs {
				all[i] = p.msg
			}
			if err := c.batch(ctx, btx, all); err != nil {
				return err
			}
			return pgtx.Aborted(tx)
		}
		for ; failedAt < len(msgs); failedAt++ {
			if err := c.handler(ctx, btx, msgs[failedAt].msg); err != nil {
				return err
			}
			if err := pgtx.Aborted(tx); err != nil {
				return err // the handler swallowed a statement's error
			}
		}
		return nil
	})
	if rerr := btx.Done(ctx, handlerErr != nil); rerr != nil {
		return 0, nil, errors.Join(handlerErr, fmt.Errorf("consumer: rollback to savepoint: %w", rerr))
	}
	if handlerErr != nil {
		// A cancelled context or a lost connection ends the batch; a
		// database error (transient) is left to the per-message path.
		if err := notAFailure(ctx, connLost(tx), nil); err != nil {
			return 0, nil, errors.Join(handlerErr, err)
		}
	}
	return failedAt, handlerErr, nil
}
