package inboxsql

import (
	"strings"

	"github.com/idemq/idemq/internal/errclass"
	"github.com/idemq/idemq/internal/pgutil"
)

// queries holds the statements of the claim protocol, the leases and
// GC, rendered once for a table; admin holds the administration's.
type queries struct {
	registerScope, claim, takeOver, takeOverBatch, recordFailure, failClaim string
	unclaim, deadLetter, claimBatch, get, getBatch, recordConflict          string
	gc, gcConflicts, acquire, acquireAsync, complete, fail, extend, abandon string
	lookup, boundaryLock                                                    string
	admin                                                                   Admin
}

// Admin holds the statements of package inbox's administration (dead
// letters, conflicts, groups, stats, expired leases), rendered for the
// Store's table. Package inbox documents their parameters where it runs
// them.
type Admin struct {
	ListDead, ReleaseDead, PurgeDead, DeadGroups, Unclassified, Classify  string
	ListConflicts, ReleaseConflicts, PurgeConflicts, Stats, ExpiredLeases string
}

// Admin returns the administration's statements.
func (s *Store) Admin() *Admin { return &s.sql.admin }

func newQueries(t pgutil.Table) queries {
	render := renderer(t)
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
INSERT INTO {{table}} AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, failures, last_error, error_class)
VALUES (now() + $5::interval, $2, $1, {{failed_final}}, $3, $4, $6, $7, $8)
ON CONFLICT (scope_id, key_id) DO UPDATE
SET status = excluded.status, failures = greatest(r.failures, excluded.failures), last_error = excluded.last_error,
	error_class = excluded.error_class, updated_at = now(), expires_at = excluded.expires_at
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

		gc: render(`
DELETE FROM {{table}} t USING (
	SELECT scope_id, key_id FROM {{table}}
	WHERE expires_at < now() AND NOT (status = {{in_progress}} AND lease_until > now())
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) expired
WHERE t.scope_id = expired.scope_id AND t.key_id = expired.key_id`),

		// A new key is claimed; an existing one only when a previous
		// attempt failed retryably or its lease ran out, and only with the
		// same fingerprint. Every takeover bumps attempts; failures counts
		// only attempts that failed. The fencing token is the larger of the
		// previous token + 1 and the clock in microseconds (greatest skips
		// a NULL), so that it never goes back when GC deleted the record.
		// $1 scope, $2 key id, $3 fingerprint, $4 key text, $5 retention,
		// $6 owner, $7 lease duration.
		acquire: render(strings.Replace(acquire, "{{async}}", "", 1)),

		// acquire committed without waiting for its WAL to reach disk
		// (Config.AsyncAcquire): set_config(…, true) lasts until the
		// statement's own transaction commits. $1 … $7 as in acquire.
		acquireAsync: render(strings.Replace(acquire, "{{async}}", "FROM (SELECT set_config('synchronous_commit', 'off', true)) async", 1)),

		// Finalizers are compare-and-set on the fencing token.
		// $1 scope, $2 key id, $3 token, then their own arguments.
		complete: render(`
UPDATE {{table}} SET status = {{succeeded}}, result = $4, owner = NULL, lease_until = NULL, last_error = NULL,
	updated_at = now(), expires_at = now() + $5::interval
WHERE scope_id = $1 AND key_id = $2 AND token = $3 AND status = {{in_progress}}`),

		fail: render(`
UPDATE {{table}} SET status = $4, failures = failures + 1, last_error = $5, owner = NULL, lease_until = NULL,
	updated_at = now(), expires_at = now() + $6::interval
WHERE scope_id = $1 AND key_id = $2 AND token = $3 AND status = {{in_progress}}`),

		// A lease given back runs out at once: any later now() is past it,
		// so the next Acquire takes over.
		abandon: render(`
UPDATE {{table}} SET lease_until = now() - interval '1 microsecond', updated_at = now()
WHERE scope_id = $1 AND key_id = $2 AND token = $3 AND status = {{in_progress}}`),

		extend: render(`
UPDATE {{table}} SET lease_until = now() + $4::interval, updated_at = now()
WHERE scope_id = $1 AND key_id = $2 AND token = $3 AND status = {{in_progress}}
RETURNING lease_until`),

		// The records of key id $1 in every scope: one primary-key probe
		// per scope (scopes are few: consumers and request routes).
		lookup: render(`
SELECT s.name, coalesce(r.error_class, ''), {{columns}}
FROM {{scopes}} s CROSS JOIN LATERAL (SELECT * FROM {{table}} r WHERE r.scope_id = s.id AND r.key_id = $1) r
ORDER BY r.updated_at DESC`),

		gcConflicts: render(`
DELETE FROM {{conflicts}} t USING (
	SELECT scope_id, key_id, fingerprint FROM {{conflicts}}
	WHERE expires_at < now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) expired
WHERE t.scope_id = expired.scope_id AND t.key_id = expired.key_id AND t.fingerprint = expired.fingerprint`),

		admin: Admin{
			// Dead letters selected by a DeadFilter (see deadWhere), oldest
			// first.
			ListDead: render(`
SELECT s.name, r.key_id, r.key_text, {{columns}}, coalesce(r.error_class, '` + errclass.Unclassified + `')
FROM {{table}} r JOIN {{scopes}} s ON s.id = r.scope_id
WHERE ` + deadWhere + `
ORDER BY r.updated_at, r.key_id
LIMIT $5`),
			// Dead letters grouped by error class and scope, through the
			// partial (scope_id, error_class, updated_at) index of migration
			// 0006, with a sample (the oldest key of the group), most
			// numerous first, up to $5 groups.
			DeadGroups: render(`
SELECT g.class, s.name, g.n, g.first, g.last, k.key_id, k.key_text, k.last_error
FROM (SELECT r.scope_id, r.error_class AS class, count(*) AS n, min(r.updated_at) AS first, max(r.updated_at) AS last
      FROM {{table}} r JOIN {{scopes}} s ON s.id = r.scope_id
      WHERE ` + deadWhere + `
      GROUP BY r.scope_id, r.error_class) AS g
JOIN {{scopes}} s ON s.id = g.scope_id
CROSS JOIN LATERAL (SELECT r.key_id, r.key_text, r.last_error FROM {{table}} r
      WHERE r.scope_id = g.scope_id AND r.status = {{failed_final}} AND r.error_class IS NOT DISTINCT FROM g.class
      ORDER BY r.updated_at LIMIT 1) AS k
ORDER BY g.n DESC, g.class, s.name
LIMIT $5`),
			// Up to $1 dead letters stored without a class (scope, key id,
			// error); classify sets the classes $3 of keys ($1, $2).
			Unclassified: render(`
SELECT scope_id, key_id, coalesce(last_error, '') FROM {{table}}
WHERE status = {{failed_final}} AND error_class IS NULL LIMIT $1`),
			Classify: render(`
UPDATE {{table}} r SET error_class = u.c
FROM unnest($1::int4[], $2::uuid[], $3::text[]) AS u(s, k, c)
WHERE r.scope_id = u.s AND r.key_id = u.k AND r.status = {{failed_final}} AND r.error_class IS NULL`),
			// Per scope, at most $1 expired leases, oldest first, from the
			// partial index of records in progress (migration 0007): their
			// number, the oldest expiry and the oldest one's key, owner and
			// token.
			ExpiredLeases: render(`
SELECT s.name, e.n, e.oldest, e.key, e.owner, e.token
FROM {{scopes}} s CROSS JOIN LATERAL (
	SELECT count(*) AS n, min(l.lease_until) AS oldest,
		(array_agg(l.key ORDER BY l.lease_until))[1] AS key,
		(array_agg(l.owner ORDER BY l.lease_until))[1] AS owner,
		(array_agg(l.token ORDER BY l.lease_until))[1] AS token
	FROM (
		SELECT r.lease_until, coalesce(r.key_text, r.key_id::text) AS key, coalesce(r.owner, '') AS owner,
			coalesce(r.token, r.attempts) AS token
		FROM {{table}} r
		WHERE r.scope_id = s.id AND r.status = {{in_progress}} AND r.lease_until < now()
		ORDER BY r.lease_until
		LIMIT $1
	) l
) e
WHERE e.n > 0
ORDER BY e.oldest`),
			// A released dead letter is FAILED_RETRYABLE with no failures: the
			// next delivery takes it over and applies the message afresh.
			ReleaseDead: render(`
UPDATE {{table}} t SET status = {{failed_retryable}}, failures = 0, error_class = NULL, updated_at = now()
FROM (` + deadSelect + `) d
WHERE t.scope_id = d.scope_id AND t.key_id = d.key_id`),
			PurgeDead: render(`
DELETE FROM {{table}} t USING (` + deadSelect + `) d
WHERE t.scope_id = d.scope_id AND t.key_id = d.key_id`),
			Stats: render(`SELECT status, count(*), min(updated_at) FROM {{table}} GROUP BY status
UNION ALL SELECT 0, count(*), min(updated_at) FROM {{conflicts}}`),
			// Conflicts selected by a DeadFilter (see conflictWhere).
			ListConflicts: render(`
SELECT s.name, r.key_id, r.key_text, r.fingerprint, r.seen, r.created_at, r.updated_at
FROM {{conflicts}} r JOIN {{scopes}} s ON s.id = r.scope_id
WHERE ` + conflictWhere + `
ORDER BY r.updated_at, r.key_id
LIMIT $5`),
			// A released conflict replaces its key's record with a failed
			// attempt of the conflicting payload, no failure counted: the next
			// delivery of that message is applied. A payload the key was
			// applied with goes to superseded, so its redeliveries stay
			// duplicates; one never applied (a dead letter, a failed attempt)
			// is dropped and would now conflict. Of several conflicts of one
			// key the latest is released; a conflict whose payload was applied
			// before (superseded) is never released.
			ReleaseConflicts: render(`
WITH released AS (
	DELETE FROM {{conflicts}} c USING (
		SELECT DISTINCT ON (r.scope_id, r.key_id) r.scope_id, r.key_id, r.fingerprint
		FROM {{conflicts}} r JOIN {{scopes}} s ON s.id = r.scope_id
		LEFT JOIN {{table}} k ON k.scope_id = r.scope_id AND k.key_id = r.key_id
		WHERE ` + conflictWhere + ` AND k.status IS DISTINCT FROM {{in_progress}}
			AND NOT coalesce(r.fingerprint = ANY(k.superseded), false)
		ORDER BY r.scope_id, r.key_id, r.updated_at DESC
		LIMIT $5
	) d
	WHERE c.scope_id = d.scope_id AND c.key_id = d.key_id AND c.fingerprint = d.fingerprint
	RETURNING c.scope_id, c.key_id, c.fingerprint
), replaced AS (
	UPDATE {{table}} t SET status = {{failed_retryable}}, fingerprint = released.fingerprint, failures = 0,
		result = NULL, last_error = NULL, updated_at = now(),
		superseded = CASE WHEN t.status = {{succeeded}} THEN array_append(t.superseded, t.fingerprint) ELSE t.superseded END
	FROM released
	WHERE t.scope_id = released.scope_id AND t.key_id = released.key_id
)
SELECT count(*) FROM released`),
			PurgeConflicts: render(`
DELETE FROM {{conflicts}} c USING (
	SELECT r.scope_id, r.key_id, r.fingerprint FROM {{conflicts}} r JOIN {{scopes}} s ON s.id = r.scope_id
	WHERE ` + conflictWhere + `
	ORDER BY r.updated_at, r.key_id
	LIMIT $5
	FOR UPDATE OF r
) d
WHERE c.scope_id = d.scope_id AND c.key_id = d.key_id AND c.fingerprint = d.fingerprint`),
		},
	}
}

// acquire is the statement of Acquire, {{async}} the place of the
// clause that commits it without waiting for its WAL (acquireAsync).
const acquire = `
INSERT INTO {{table}} AS r (expires_at, key_id, scope_id, status, fingerprint, key_text, owner, lease_until, token)
SELECT now() + $5::interval, $2::uuid, $1::int, {{in_progress}}, $3::bytea, $4::text, $6::text, now() + $7::interval, {{now_us}}
{{async}}
ON CONFLICT (scope_id, key_id) DO UPDATE
SET attempts = r.attempts + 1, token = greatest(r.token + 1, excluded.token), status = {{in_progress}},
	owner = excluded.owner, lease_until = excluded.lease_until, updated_at = now(), expires_at = excluded.expires_at
WHERE r.fingerprint = excluded.fingerprint
	AND (r.status = {{failed_retryable}} OR (r.status = {{in_progress}} AND r.lease_until < now()))
RETURNING r.token, r.lease_until, r.failures`

// deadWhere selects dead letters by a DeadFilter: static SQL whose
// parameters are NULL when a filter field is unset. $1 scope, $2 key id,
// $3 failed before, $4 failed at or after, $6 error class (unclassified:
// stored without one).
const deadWhere = `r.status = {{failed_final}}
	AND ($1::text IS NULL OR s.name = $1) AND ($2::uuid IS NULL OR r.key_id = $2)
	AND ($3::timestamptz IS NULL OR r.updated_at < $3) AND ($4::timestamptz IS NULL OR r.updated_at >= $4)
	AND ($6::text IS NULL OR r.error_class = $6 OR ($6 = '` + errclass.Unclassified + `' AND r.error_class IS NULL))`

// conflictWhere is deadWhere for the conflicts table, by when a conflict
// was last seen.
const conflictWhere = `($1::text IS NULL OR s.name = $1) AND ($2::uuid IS NULL OR r.key_id = $2)
	AND ($3::timestamptz IS NULL OR r.updated_at < $3) AND ($4::timestamptz IS NULL OR r.updated_at >= $4)`

// deadSelect locks the dead letters that release and purge change, oldest
// first, up to the limit $5 (NULL for all).
const deadSelect = `
	SELECT r.scope_id, r.key_id FROM {{table}} r JOIN {{scopes}} s ON s.id = r.scope_id
	WHERE ` + deadWhere + `
	ORDER BY r.updated_at, r.key_id
	LIMIT $5
	FOR UPDATE OF r`
