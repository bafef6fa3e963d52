-- The dead letters by group (error class and destination): how many, the
-- first and the last failure. The console's dead-letter page, a group's
-- page and Stats read these few rows instead of grouping a dead-letter
-- table that may hold millions of rows with classes of up to 200 bytes
-- (grouping 1M of them read the whole (error_class, destination, seq)
-- index: seconds per page view).
--
-- Statement-level triggers with transition tables keep it exact, in the
-- transaction that writes the dead letters: one upsert per group a
-- statement touches (the relay buries a batch in one statement; Replay and
-- Purge settle their rows in one), in (class, destination) order, so that
-- two transactions that touch the same groups lock their rows in the same
-- order. Unclassified rows (error_class NULL) count under class ''.
--
-- first_failed and last_failed stay exact when rows leave a group: when
-- the rows removed held the group's first or last failure, the trigger
-- reads the group's new edge from the (error_class, destination, seq)
-- index of migration 0003; a group whose count reaches 0 is deleted.
CREATE TABLE {{table_dead_groups}} (
    class        text        NOT NULL,
    destination  text        NOT NULL,
    n            bigint      NOT NULL,
    first_failed timestamptz NOT NULL,
    last_failed  timestamptz NOT NULL,
    PRIMARY KEY (class, destination)
);

CREATE FUNCTION {{table_dead_groups_sync}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM {{table_dead_groups}};
        RETURN NULL;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        -- Lock the groups in key order, then take the removed rows off.
        PERFORM 1 FROM {{table_dead_groups}} AS g
        WHERE (g.class, g.destination) IN (SELECT coalesce(o.error_class, ''), o.destination FROM old_rows AS o)
        ORDER BY g.class, g.destination FOR UPDATE;
        WITH gone AS (
            SELECT coalesce(error_class, '') AS class, destination, count(*) AS n, min(failed_at) AS first, max(failed_at) AS last
            FROM old_rows GROUP BY 1, 2)
        UPDATE {{table_dead_groups}} AS g SET n = g.n - gone.n,
            first_failed = CASE WHEN gone.first > g.first_failed THEN g.first_failed
                WHEN g.class = '' THEN coalesce((SELECT min(d.failed_at) FROM {{table_dead}} AS d
                    WHERE d.error_class IS NULL AND d.destination = g.destination), g.first_failed)
                ELSE coalesce((SELECT min(d.failed_at) FROM {{table_dead}} AS d
                    WHERE d.error_class = g.class AND d.destination = g.destination), g.first_failed) END,
            last_failed = CASE WHEN gone.last < g.last_failed THEN g.last_failed
                WHEN g.class = '' THEN coalesce((SELECT max(d.failed_at) FROM {{table_dead}} AS d
                    WHERE d.error_class IS NULL AND d.destination = g.destination), g.last_failed)
                ELSE coalesce((SELECT max(d.failed_at) FROM {{table_dead}} AS d
                    WHERE d.error_class = g.class AND d.destination = g.destination), g.last_failed) END
        FROM gone WHERE g.class = gone.class AND g.destination = gone.destination;
        DELETE FROM {{table_dead_groups}} AS g
        WHERE g.n <= 0 AND (g.class, g.destination) IN (SELECT coalesce(o.error_class, ''), o.destination FROM old_rows AS o);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO {{table_dead_groups}} AS g (class, destination, n, first_failed, last_failed)
        SELECT coalesce(error_class, ''), destination, count(*), min(failed_at), max(failed_at)
        FROM new_rows GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (class, destination) DO UPDATE SET n = g.n + excluded.n,
            first_failed = least(g.first_failed, excluded.first_failed), last_failed = greatest(g.last_failed, excluded.last_failed);
    END IF;
    RETURN NULL;
END
$$;

-- Creating the triggers locks the dead-letter table against writers until
-- this migration commits, so the count below misses no row and counts
-- none twice.
CREATE TRIGGER dead_groups_insert AFTER INSERT ON {{table_dead}}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{table_dead_groups_sync}}();
CREATE TRIGGER dead_groups_delete AFTER DELETE ON {{table_dead}}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {{table_dead_groups_sync}}();
CREATE TRIGGER dead_groups_update AFTER UPDATE ON {{table_dead}}
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{table_dead_groups_sync}}();
CREATE TRIGGER dead_groups_truncate AFTER TRUNCATE ON {{table_dead}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{table_dead_groups_sync}}();

-- The dead letters per destination that failed since a time (the
-- console's overview: the last hour, the last five minutes) come from this
-- index alone, without a visit to the wide rows.
CREATE INDEX ON {{table_dead}} (failed_at) INCLUDE (destination);

INSERT INTO {{table_dead_groups}} (class, destination, n, first_failed, last_failed)
SELECT coalesce(error_class, ''), destination, count(*), min(failed_at), max(failed_at)
FROM {{table_dead}} GROUP BY 1, 2;
