ALTER TABLE {{table}} DROP COLUMN superseded;
