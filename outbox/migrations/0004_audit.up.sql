-- The audit log of operator actions on this outbox and the stores beside it
-- (replay, purge, release, enable an endpoint), from the console and the
-- idemq binary: who, what, with which filter, how many rows, when. Rows
-- are only ever inserted; the console shows the latest first through the
-- primary key.
CREATE TABLE {{table_audit}} (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text        NOT NULL,
    action text        NOT NULL,
    target text        NOT NULL DEFAULT '',
    filter jsonb       NOT NULL DEFAULT '{}',
    rows   bigint      NOT NULL DEFAULT 0
);
