// Package benchseed fills the default outbox tables (public.idemq_outbox
// and its dead letters) with large data sets for the benchmarks of the
// gauges, the dead-letter groups and the console's pages, with
// generate_series in one statement each.
package benchseed

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemq/idemq/internal/errclass"
)

// DB is what the seeds need of a pool or a connection. The caller
// migrates the outbox first: benchseed stands below the stores and
// imports none of them.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Backlog inserts n pending rows: 8 destinations (dest-0 to dest-7),
// 100,000 keys (k0 to k99999) over the 64 partitions and one row in 50
// unkeyed; then analyzes the table, as autovacuum would.
func Backlog(ctx context.Context, db DB, n int) error {
	if _, err := db.Exec(ctx, `INSERT INTO idemq_outbox (id, destination, key, payload)
SELECT gen_random_uuid(), 'dest-' || (i % 8), CASE WHEN i % 50 = 0 THEN NULL ELSE 'k' || (i % 100000) END, '\x7b7d'
FROM generate_series(1, $1) AS i`, n); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `ANALYZE idemq_outbox`)
	return err
}

// errorTexts are the last errors of the seeded dead letters: the forms
// the clients idemq uses return (see internal/errclass/testdata), padded
// the way a wrapping caller does, with {i} (a number) and {hex} (32 hex
// digits) where their variable parts go. Their classes are 60 to 200
// bytes long, as the relay writes for real errors.
var errorTexts = []string{
	`webhook: endpoint ep-{i}: HTTP 503: webhook-id msg_{hex} rejected: upstream queue full, retry after the backlog drains`,
	`webhook: endpoint ep-{i}: HTTP 500: {"error":"internal","request_id":"req_{hex}","detail":"database timeout after {i}ms"}`,
	`webhook: endpoint ep-{i}: HTTP 410: endpoint gone: subscription sub_{hex} was deleted by its owner on the receiving side`,
	`webhook: endpoint ep-{i}: Post "https://hooks.example.com/in?attempt={i}": dial tcp 10.1.2.7:443: connect: connection refused`,
	`webhook: endpoint ep-{i}: Post "https://hooks.example.com/in": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`,
	`webhook: endpoint ep-{i}: Post "https://hooks.example.com/in": tls: failed to verify certificate: x509: certificate has expired or is not yet valid`,
	`kafka: publish orders-{i}: [6] Not Leader For Partition: the client attempted to send messages to a replica that is not the leader`,
	`kafka: publish orders-{i}: [10] Message Size Too Large: the server has a configurable maximum message size to avoid unbounded memory allocation`,
	`kafka: publish orders-{i}: TOPIC_AUTHORIZATION_FAILED: Not authorized to access topics: [Topic authorization failed.] principal User:svc-{i}`,
	`kafka: publish orders-{i}: records have timed out before they were able to be produced, last err: unable to dial: dial tcp 10.0.0.9:9092: i/o timeout`,
	`kafka: publish orders-{i}: UNKNOWN_TOPIC_OR_PARTITION: This server does not host this topic-partition. (request req_{hex})`,
	`nats: publish orders.{i}: nats: timeout waiting for the JetStream acknowledgement of message msg_{hex} on stream ORDERS`,
	`nats: publish orders.{i}: nats: API error: code=503 err_code=10077 description=JetStream resource limits exceeded for account`,
	`nats: publish orders.{i}: nats: no responders available for request: is the stream ORDERS defined for subject orders.{i}?`,
	`nats: publish orders.{i}: nats: maximum payload exceeded: message msg_{hex} is {i} bytes, the server accepts 1048576`,
	`permanent: ERROR: duplicate key value violates unique constraint "payments_pkey" (SQLSTATE 23505) for payment pay_{hex}`,
	`permanent: ERROR: insert or update on table "shipments" violates foreign key constraint "shipments_order_fk" (SQLSTATE 23503)`,
	`failed to connect to ` + "`user=app database=billing`" + `: 10.2.0.7:5432 (10.2.0.7): dial error: dial tcp 10.2.0.7:5432: connect: connection refused after {i} ms`,
	`operation error DynamoDB: PutItem, https response error StatusCode: 400, RequestID: {HEX}, ConditionalCheckFailedException: The conditional request failed`,
	`operation error DynamoDB: PutItem, https response error StatusCode: 400, RequestID: {HEX}, ProvisionedThroughputExceededException: Rate of requests exceeds the allowed throughput`,
	`redis: enqueue job_{hex}: WRONGTYPE Operation against a key holding the wrong kind of value (key jobs:{i})`,
	`redis: enqueue job_{hex}: dial tcp 10.3.0.5:6379: connect: connection refused after {i} attempts`,
	`handler: order ord_{hex}: payload does not match schema version {i}: field "amount" must be a positive decimal with at most two places`,
}

// fill returns text with its placeholders filled in for row i, as the
// SQL of DeadLetters does.
func fill(text string, i int) string {
	h := md5.Sum([]byte(strconv.Itoa(i)))
	hx := hex.EncodeToString(h[:])
	return strings.NewReplacer("{i}", strconv.Itoa(i), "{hex}", hx, "{HEX}", strings.ToUpper(hx+hx[:20])).Replace(text)
}

// DeadLetters inserts n dead letters with seqs from 1,000,000,000 on: 23
// error classes over the 8 destinations (184 groups), failed within the
// last day, each with a realistic text (errorTexts) and its class as the
// relay computes it; then vacuums the table, as autovacuum leaves it at
// rest.
func DeadLetters(ctx context.Context, db DB, n int) error {
	cls, err := classes()
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO idemq_outbox_dead (seq, id, created_at, failed_at, attempts, destination, payload, key, last_error, error_class)
SELECT 1000000000 + i, gen_random_uuid(), now() - interval '1 day', now() - (i % 86400) * interval '1 second', 5,
       'dest-' || (i % 8), '\x7b7d', 'k' || (i % 50000),
       replace(replace(replace(t.texts[1 + i % $4], '{i}', i::text), '{hex}', md5(i::text)),
               '{HEX}', upper(md5(i::text) || left(md5(i::text), 20))),
       t.classes[1 + i % $4]
FROM generate_series(1, $1) AS i, (SELECT $2::text[] AS texts, $3::text[] AS classes) AS t`, n, errorTexts, cls, len(errorTexts)); err != nil {
		return err
	}
	_, err = db.Exec(ctx, `VACUUM ANALYZE idemq_outbox_dead`)
	return err
}

// classes returns the class of each of errorTexts, checking that each text
// has one whatever its variable parts.
func classes() ([]string, error) {
	out := make([]string, len(errorTexts))
	for j, text := range errorTexts {
		out[j] = errclass.Of(fill(text, 1))
		if other := errclass.Of(fill(text, 7919)); other != out[j] {
			return nil, fmt.Errorf("benchseed: %q has two classes: %q and %q", text, out[j], other)
		}
	}
	return out, nil
}

// InboxDeadLetters inserts n dead letters (FAILED_FINAL records) into the
// default inbox table (public.idemq_inbox, migrated): 8 scopes, the texts
// and classes of DeadLetters (184 groups), failed within the last day;
// then vacuums the table.
func InboxDeadLetters(ctx context.Context, db DB, n int) error {
	cls, err := classes()
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO idemq_inbox_scopes (name) SELECT 'consumer-' || i FROM generate_series(0, 7) AS i`); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO idemq_inbox (created_at, updated_at, expires_at, key_id, scope_id, attempts, status, fingerprint,
       key_text, last_error, failures, error_class)
SELECT now() - interval '1 day', now() - (i % 86400) * interval '1 second', now() + interval '7 days', gen_random_uuid(),
       (SELECT id FROM idemq_inbox_scopes WHERE name = 'consumer-' || (i % 8)), 5, 4, '\x00', 'msg-' || i,
       replace(replace(replace(t.texts[1 + i % $4], '{i}', i::text), '{hex}', md5(i::text)),
               '{HEX}', upper(md5(i::text) || left(md5(i::text), 20))),
       5, t.classes[1 + i % $4]
FROM generate_series(1, $1) AS i, (SELECT $2::text[] AS texts, $3::text[] AS classes) AS t`, n, errorTexts, cls, len(errorTexts)); err != nil {
		return err
	}
	_, err = db.Exec(ctx, `VACUUM ANALYZE idemq_inbox`)
	return err
}
