-- What came of each audited action: "done", "nothing to do" (it matched no
-- row: a group replayed already, a message purged by someone else), or
-- "failed: <error>". The console records every action an operator
-- confirmed, including those that changed nothing or failed, so that the
-- log answers "who tried what" and not only "what changed". Entries written
-- before this migration, and by callers that leave it unset, keep ''.
ALTER TABLE {{table_audit}} ADD COLUMN outcome text NOT NULL DEFAULT '';
