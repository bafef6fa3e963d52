package relay

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/outboxsql"
	"github.com/idemq/idemq/outbox"
)

// OutboxName names the outbox ob on db's database uniquely among the
// outboxes of every Postgres cluster: "<system identifier>/<database>/
// <schema>.<table>", such as "7712741991429212289/shop/public.idemq_outbox".
// A Sink that keeps per-outbox state in a broker shared with other
// outboxes is told which outbox it serves with it (the transactional
// Kafka Sink's TxConfig.Outbox, whose names derive from it). It is the
// same for every relay of the outbox and for a replica promoted in its
// place; it changes when the database moves to another cluster (a dump
// and restore, pg_upgrade), and with it the names derived from it.
func OutboxName(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, ob *outbox.Outbox) (string, error) {
	var system, database string
	if err := db.QueryRow(ctx, outboxsql.Cluster).Scan(&system, &database); err != nil {
		return "", fmt.Errorf("relay: name the outbox: %w", err)
	}
	return system + "/" + database + "/" + ob.Config().Schema + "." + ob.Config().Table, nil
}
