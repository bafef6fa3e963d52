DROP TABLE {{table_conflicts}};
