package inbox

import (
	"fmt"

	"github.com/idemq/idemq/internal/pgutil"
)

// queries holds every statement of the Store, rendered once for its table.
type queries struct {
	registerScope, claim, deadLetter, claimBatch, unclaim, get, getBatch, gc string
	acquire, complete, fail, extend                                          string
}

// recordColumns are the stored columns a Record is read from, in the order
// of storedRecord.dest.
const recordColumns = `r.created_at, r.updated_at, r.expires_at, r.attempts, r.status,
	r.fingerprint, r.owner, r.lease_until, r.result, r.last_error`

func newQueries(t pgutil.Table) queries {
	table, scopes := t.String(), t.Ident("_scopes")
	render := func(sql string) string { return fmt.Sprintf(sql, table, recordColumns, scopes) }
	return queries{
		registerScope: render(`
WITH registered AS (
	INSERT INTO %[3]s (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id
)
SELECT id FROM registered UNION ALL SELECT id FROM %[3]s WHERE name = $1 LIMIT 1`),

		claim: render(insertRecord(Succeeded, "DO NOTHING")),

		// A dead letter also takes over a record a leased attempt released.
		deadLetter: render(insertRecord(FailedFinal, `(scope_id, key_id) DO UPDATE
	SET status = excluded.status, attempts = greatest(r.attempts, excluded.attempts), last_error = excluded.last_error,
		updated_at = now(), expires_at = excluded.expires_at
	WHERE r.status = 3 AND r.fingerprint = excluded.fingerprint`)),

		// Keys are inserted in key order so that concurrent batches lock
		// them in the same order and cannot deadlock.
		claimBatch: render(`
INSERT INTO %[1]s (expires_at, key_id, scope_id, status, fingerprint, key_text)
SELECT now() + $5::interval, key_id, $1, 2, fingerprint, key_text
FROM unnest($2::uuid[], $3::bytea[], $4::text[]) AS i(key_id, fingerprint, key_text)
ORDER BY key_id
ON CONFLICT DO NOTHING
RETURNING key_id`),

		unclaim: render(`DELETE FROM %[1]s WHERE scope_id = $1 AND key_id = ANY($2)`),

		get: render(`SELECT %[2]s FROM %[1]s r WHERE r.scope_id = $1 AND r.key_id = $2`),

		getBatch: render(`SELECT r.key_id, %[2]s FROM %[1]s r WHERE r.scope_id = $1 AND r.key_id = ANY($2)`),

		gc: render(`
DELETE FROM %[1]s t USING (
	SELECT scope_id, key_id FROM %[1]s
	WHERE expires_at < now() AND NOT (status = 1 AND lease_until > now())
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) expired
WHERE t.scope_id = expired.scope_id AND t.key_id = expired.key_id`),

		// A new key is claimed; an existing one only when a previous
		// attempt failed retryably or its lease ran out, and only with the
		// same fingerprint. Every takeover bumps attempts, the fencing token.
		// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention,
		// $6 owner, $7 lease duration.
		acquire: render(`
INSERT INTO %[1]s AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, owner, lease_until)
VALUES (now() + $5::interval, $2, $1, 1, $3, $4, $6, now() + $7::interval)
ON CONFLICT (scope_id, key_id) DO UPDATE
SET attempts = r.attempts + 1, status = 1, owner = excluded.owner,
	lease_until = excluded.lease_until, updated_at = now(), expires_at = excluded.expires_at
WHERE r.fingerprint = excluded.fingerprint
	AND (r.status = 3 OR (r.status = 1 AND r.lease_until < now()))
RETURNING r.attempts, r.lease_until`),

		// Finalizers are compare-and-set on the fencing token.
		// $1 scope, $2 key id, $3 token, then their own arguments.
		complete: render(`
UPDATE %[1]s SET status = 2, result = $4, owner = NULL, lease_until = NULL, last_error = NULL,
	updated_at = now(), expires_at = now() + $5::interval
WHERE scope_id = $1 AND key_id = $2 AND attempts = $3 AND status = 1`),

		fail: render(`
UPDATE %[1]s SET status = $4, last_error = $5, owner = NULL, lease_until = NULL,
	updated_at = now(), expires_at = now() + $6::interval
WHERE scope_id = $1 AND key_id = $2 AND attempts = $3 AND status = 1`),

		extend: render(`
UPDATE %[1]s SET lease_until = now() + $4::interval, updated_at = now()
WHERE scope_id = $1 AND key_id = $2 AND attempts = $3 AND status = 1
RETURNING lease_until`),
	}
}

// insertRecord renders the insert of a record with status; the stored
// record is read only when it did not take effect, the duplicate path.
// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention,
// $6 attempts, $7 last error.
func insertRecord(status Status, onConflict string) string {
	return `
INSERT INTO %[1]s AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, attempts, last_error)
VALUES (now() + $5::interval, $2, $1, ` + fmt.Sprint(int16(status)) + `, $3, $4, $6, $7)
ON CONFLICT ` + onConflict
}
