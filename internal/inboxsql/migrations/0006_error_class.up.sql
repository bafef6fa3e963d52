-- error_class groups dead letters (FAILED_FINAL) by cause: the last error's
-- text with its variable parts replaced by placeholders, prefixed with the
-- error type it names (see internal/errclass). DeadLetterTx writes it;
-- records dead-lettered before this migration, or by a leased worker's
-- Fail, keep NULL, shown and filtered as 'unclassified', until
-- Store.ClassifyDead fills it in from their text. Adding the column
-- rewrites nothing.
ALTER TABLE {{table}} ADD COLUMN error_class text;

-- Grouping by scope and class reads this partial index, which holds only
-- the dead letters. It replaces nothing: building it reads the table once,
-- under the migration's lock.
CREATE INDEX ON {{table}} (scope_id, error_class, updated_at) WHERE status = 4;
