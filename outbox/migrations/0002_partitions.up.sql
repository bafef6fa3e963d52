-- Relays lease hash partitions of the ordering keys instead of locking keys
-- one by one (see the relay package documentation, "Order").
--
-- {{table}}_relays lists the relay workers: each one keeps its row's
-- expires_at in the future while it lives and deletes it when it stops.
-- {{table}}_lease has one row per partition: the worker that owns it (NULL:
-- nobody), token, which grows with every change of owner (the fencing
-- token: a batch holds its partitions' rows FOR SHARE and checks the token,
-- so a takeover waits for a stale owner's batch and the stale owner never
-- claims again), and gen, which grows whenever rows of the partition are
-- moved behind its owner's back (dead-letter Replay, Purge, Unpark), so that
-- the owner scans the partition again from its start.
--
-- A key's partition is mod(hashtext(key) + 2^31, 64): 64 partitions, fixed
-- here and in internal/outboxsql (Partitions).
CREATE TABLE {{table_relays}} (
    owner      uuid        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

CREATE TABLE {{table_lease}} (
    part  int    PRIMARY KEY,
    owner uuid,
    token bigint NOT NULL DEFAULT 0,
    gen   bigint NOT NULL DEFAULT 0
);

INSERT INTO {{table_lease}} (part) SELECT generate_series(0, 63);

-- The relay reads each partition (unkeyed rows: partition -1) in seq order
-- from where it left it, through this index. It replaces the (key, seq)
-- index of the head probe, which is gone with the key advisory locks; the
-- few statements that look rows up by key (parking and unparking a key's
-- followers) go through their partitions. The expression is the one in
-- internal/outboxsql (partition), exactly, or the index is not used.
CREATE INDEX ON {{table}} ((coalesce(mod(hashtext(key)::int8 + 2147483648, 64)::int4, -1)), seq);

DROP INDEX {{table_key_seq_idx}};
