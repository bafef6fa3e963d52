-- failures counts the attempts whose handler failed. It alone decides when a
-- message becomes a dead letter: attempts, the fencing token, also grows
-- when a crashed worker's lease is taken over, and a crash is not a
-- failure.
ALTER TABLE {{table}} ADD COLUMN failures int NOT NULL DEFAULT 0;

-- Dead letters (status 4, FAILED_FINAL) are listed, released and purged
-- per scope and age; the partial index holds only them.
CREATE INDEX ON {{table}} (scope_id, updated_at) WHERE status = 4;
