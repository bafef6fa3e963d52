package inboxsql

import "github.com/idemq/idemq/internal/pgutil"

// queries holds the statements of the claim protocol and the shared
// record reads, rendered once for a table.
type queries struct {
	registerScope, claim, takeOver, takeOverBatch, recordFailure, failClaim string
	unclaim, deadLetter, claimBatch, get, getBatch, recordConflict          string
}

func newQueries(t pgutil.Table) queries {
	render := Render(t)
	return queries{
		registerScope: render(`
WITH registered AS (
	INSERT INTO {{scopes}} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id
)
SELECT id FROM registered UNION ALL SELECT id FROM {{scopes}} WHERE name = $1 LIMIT 1`),

		// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention.
		claim: render(`
INSERT INTO {{table}} (expires_at, key_id, scope_id, status, fingerprint, key_text)
VALUES (now() + $5::interval, $2, $1, {{succeeded}}, $3, $4)
ON CONFLICT DO NOTHING`),

		// A claim takes over a record whose last attempt failed. The update
		// locks the row, so concurrent claims of the key serialise here as
		// new ones do on the primary key: the second waits, then finds the
		// first's SUCCEEDED record or, after a rollback, takes over itself.
		// $1 scope, $2 key id, $3 fingerprint, $4 retention.
		takeOver: render(`
UPDATE {{table}} r SET status = {{succeeded}}, attempts = r.attempts + 1, last_error = NULL,
	updated_at = now(), expires_at = now() + $4::interval
WHERE r.scope_id = $1 AND r.key_id = $2 AND r.status = {{failed_retryable}} AND r.fingerprint = $3
RETURNING r.failures`),

		// takeOver for many keys, locked in key order like claimBatch.
		// $1 scope, $2 key ids, $3 fingerprints, $4 retention.
		takeOverBatch: render(`
UPDATE {{table}} r SET status = {{succeeded}}, attempts = r.attempts + 1, last_error = NULL,
	updated_at = now(), expires_at = now() + $4::interval
FROM (
	SELECT t.scope_id, t.key_id FROM {{table}} t
	JOIN unnest($2::uuid[], $3::bytea[]) AS i(key_id, fingerprint) USING (key_id)
	WHERE t.scope_id = $1 AND t.status = {{failed_retryable}} AND t.fingerprint = i.fingerprint
	ORDER BY t.key_id
	FOR UPDATE OF t
) locked
WHERE r.scope_id = locked.scope_id AND r.key_id = locked.key_id
RETURNING r.key_id, r.failures`),

		// A failed attempt, after its transaction rolled back: the record is
		// created FAILED_RETRYABLE or counts one more failure. A record that
		// another attempt completed or dead-lettered meanwhile is kept.
		// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention,
		// $6 error.
		recordFailure: render(`
INSERT INTO {{table}} AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, failures, last_error)
VALUES (now() + $5::interval, $2, $1, {{failed_retryable}}, $3, $4, 1, $6)
ON CONFLICT (scope_id, key_id) DO UPDATE
SET attempts = r.attempts + 1, failures = r.failures + 1, last_error = excluded.last_error,
	updated_at = now(), expires_at = excluded.expires_at
WHERE r.status = {{failed_retryable}} AND r.fingerprint = excluded.fingerprint
RETURNING {{columns}}`),

		// A failed attempt of a key claimed in the same transaction (a batch
		// rewound the handler to its savepoint; the claim stands).
		// $1 scope, $2 key id, $3 error.
		failClaim: render(`
UPDATE {{table}} r SET status = {{failed_retryable}}, failures = r.failures + 1, last_error = $3, updated_at = now()
WHERE r.scope_id = $1 AND r.key_id = $2 AND r.status = {{succeeded}}
RETURNING {{columns}}`),

		// Undoes a claim made in the same transaction without counting a
		// failure: a new record goes, a taken-over one is FAILED_RETRYABLE
		// again with its failures. $1 scope, $2 key id.
		unclaim: render(`
WITH gone AS (
	DELETE FROM {{table}} r
	WHERE r.scope_id = $1 AND r.key_id = $2 AND r.status = {{succeeded}} AND r.failures = 0
	RETURNING 1
), back AS (
	UPDATE {{table}} r SET status = {{failed_retryable}}, updated_at = now()
	WHERE r.scope_id = $1 AND r.key_id = $2 AND r.status = {{succeeded}} AND r.failures > 0
	RETURNING 1
)
SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM back)`),

		// A dead letter also takes over a record whose attempts failed.
		// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention,
		// $6 failures, $7 error.
		deadLetter: render(`
INSERT INTO {{table}} AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, failures, last_error)
VALUES (now() + $5::interval, $2, $1, {{failed_final}}, $3, $4, $6, $7)
ON CONFLICT (scope_id, key_id) DO UPDATE
SET status = excluded.status, failures = greatest(r.failures, excluded.failures), last_error = excluded.last_error,
	updated_at = now(), expires_at = excluded.expires_at
WHERE r.status = {{failed_retryable}} AND r.fingerprint = excluded.fingerprint`),

		// Keys are inserted in key order so that concurrent batches lock
		// them in the same order and cannot deadlock.
		claimBatch: render(`
INSERT INTO {{table}} (expires_at, key_id, scope_id, status, fingerprint, key_text)
SELECT now() + $5::interval, key_id, $1, {{succeeded}}, fingerprint, key_text
FROM unnest($2::uuid[], $3::bytea[], $4::text[]) AS i(key_id, fingerprint, key_text)
ORDER BY key_id
ON CONFLICT DO NOTHING
RETURNING key_id`),

		get: render(`SELECT {{columns}} FROM {{table}} r WHERE r.scope_id = $1 AND r.key_id = $2`),

		getBatch: render(`SELECT r.key_id, {{columns}} FROM {{table}} r WHERE r.scope_id = $1 AND r.key_id = ANY($2)`),

		// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention.
		recordConflict: render(`
INSERT INTO {{conflicts}} AS c (expires_at, key_id, scope_id, fingerprint, key_text)
VALUES (now() + $5::interval, $2, $1, $3, $4)
ON CONFLICT (scope_id, key_id, fingerprint) DO UPDATE
SET seen = c.seen + 1, updated_at = now(), expires_at = excluded.expires_at`),
	}
}
