-- superseded holds the fingerprints a key was applied with before a
-- released conflict handed the key to another payload: their redeliveries
-- are duplicates, never applied again and never conflicts. NULL (no
-- release) costs nothing.
ALTER TABLE {{table}} ADD COLUMN superseded bytea[];
