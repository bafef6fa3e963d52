package transporttest

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/consumer"
)

// handleAll is handle for a whole batch: the batch fails if one of its
// messages does, and its rows go out in one statement.
func (fx *fixture) handleAll(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids, payloads := make([]string, len(msgs)), make([]string, len(msgs))
	for i, msg := range msgs {
		if err := fx.check(msg); err != nil {
			return err
		}
		ids[i], payloads[i] = msg.ID, string(msg.Payload)
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, payload) SELECT * FROM unnest($1::text[], $2::text[])`, ids, payloads)
	return err
}
