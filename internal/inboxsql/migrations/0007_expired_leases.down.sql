-- Dropping the index gives Extend its HOT updates back.
DROP INDEX {{table_scope_id_lease_until_idx}};
