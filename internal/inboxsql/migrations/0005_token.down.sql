ALTER TABLE {{table}} DROP COLUMN token;
