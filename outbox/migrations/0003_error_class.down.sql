-- Dropping the column drops its index.
ALTER TABLE {{table_dead}} DROP COLUMN error_class;
