-- Scopes (consumer names, HTTP routes) get a small integer id so that the
-- inbox primary key stays (int4, uuid): 32 bytes per index entry.
CREATE TABLE {{table_scopes}} (
    id   int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL UNIQUE
);

-- One record per (scope, key). Columns are ordered widest-alignment first so
-- the tuple carries no padding; optional columns come last and cost nothing
-- when NULL.
--
-- key_id is the key itself when the key is a canonical UUID, otherwise a
-- SHA-256-derived UUID (version 8) of the key, whose text is then kept in
-- key_text.
--
-- attempts counts the claims of the record and is also its fencing token:
-- every leased claim and takeover increments it.
CREATE TABLE {{table}} (
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    key_id      uuid        NOT NULL,
    scope_id    int         NOT NULL,
    attempts    int         NOT NULL DEFAULT 1,
    status      smallint    NOT NULL,
    fingerprint bytea       NOT NULL,
    key_text    text,
    owner       text,
    lease_until timestamptz,
    result      bytea,
    last_error  text,
    PRIMARY KEY (scope_id, key_id)
);

-- GC deletes expired records in bounded batches through this index, never
-- by scanning the table.
CREATE INDEX ON {{table}} (expires_at);
