ALTER TABLE {{table_audit}} DROP COLUMN outcome;
