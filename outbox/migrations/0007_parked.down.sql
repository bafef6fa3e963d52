DROP INDEX {{table_destination_idx}};
