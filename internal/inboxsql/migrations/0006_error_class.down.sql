-- Dropping the column drops its index.
ALTER TABLE {{table}} DROP COLUMN error_class;
