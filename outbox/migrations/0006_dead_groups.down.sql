-- The index has the name Postgres chose (it may be shortened for a long
-- table name): find it by its definition.
DO $$
BEGIN
    EXECUTE (SELECT 'DROP INDEX ' || i.indexrelid::regclass::text FROM pg_index AS i
             WHERE i.indrelid = '{{table_dead}}'::regclass AND pg_get_indexdef(i.indexrelid) LIKE '%(failed_at) INCLUDE (destination)');
END
$$;
DROP TRIGGER dead_groups_insert ON {{table_dead}};
DROP TRIGGER dead_groups_delete ON {{table_dead}};
DROP TRIGGER dead_groups_update ON {{table_dead}};
DROP TRIGGER dead_groups_truncate ON {{table_dead}};
DROP FUNCTION {{table_dead_groups_sync}}();
DROP TABLE {{table_dead_groups}};
