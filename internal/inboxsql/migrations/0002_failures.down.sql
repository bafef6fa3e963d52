DROP INDEX {{table_scope_id_updated_at_idx}};
ALTER TABLE {{table}} DROP COLUMN failures;
