-- A conflict is a message whose key was already recorded with another
-- fingerprint: it was not applied. One row per (scope, key, conflicting
-- fingerprint) keeps what an operator needs to decide: when it was first
-- and last seen and how often. GC drops rows past expires_at.
CREATE TABLE {{table_conflicts}} (
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    key_id      uuid        NOT NULL,
    scope_id    int         NOT NULL,
    seen        int         NOT NULL DEFAULT 1,
    fingerprint bytea       NOT NULL,
    key_text    text,
    PRIMARY KEY (scope_id, key_id, fingerprint)
);

CREATE INDEX ON {{table_conflicts}} (expires_at);
