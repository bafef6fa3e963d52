DROP TABLE {{table_dead}};
DROP TABLE {{table}};
