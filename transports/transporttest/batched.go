package transporttest

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
)

// handleAll is handle for a whole batch: the batch fails if one of its
// messages does, and its rows go out in one statement.
func (fx *fixture) handleAll(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	for i, msg := range msgs {
		if err := fx.check(msg); err != nil {
			return err
		}
		ids[i] = msg.ID
	}
	return fx.fx.RecordAll(ctx, tx, ids...)
}
