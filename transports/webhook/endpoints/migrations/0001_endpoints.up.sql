-- The webhook endpoint registry. One row per endpoint; fan-out reads the
-- enabled ones inside the business transaction, the delivery Sink reads the
-- ones it delivers to (cached) and writes the failure clock and the disable.
--
-- event_types empty means every event type. timeout_ms, concurrency and
-- rate_per_sec 0 mean the Sink's defaults (rate 0: unlimited).
--
-- failing_since is set by the first failed delivery after a success and
-- cleared by the next success: an endpoint whose failing_since is older than
-- the Sink's DisableAfter is disabled. disabled_at NULL means enabled.
CREATE TABLE {{table}} (
    id              text        PRIMARY KEY,
    url             text        NOT NULL,
    event_types     text[]      NOT NULL DEFAULT '{}',
    timeout_ms      bigint      NOT NULL DEFAULT 0,
    concurrency     int         NOT NULL DEFAULT 0,
    rate_per_sec    float8      NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    failing_since   timestamptz,
    disabled_at     timestamptz,
    disabled_reason text        NOT NULL DEFAULT ''
);

-- The key ring. A key signs while expires_at is NULL or in the future: a
-- rotation gives the old keys an expiry (the grace period) and inserts the
-- new one, so both sign side by side until the old ones expire. Secrets
-- are stored as given (whsec_/whsk_): protect the table like a password
-- store.
CREATE TABLE {{table_keys}} (
    endpoint_id text        NOT NULL REFERENCES {{table}} (id) ON DELETE CASCADE,
    seq         bigint      GENERATED ALWAYS AS IDENTITY,
    secret      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz,
    PRIMARY KEY (endpoint_id, seq)
);
