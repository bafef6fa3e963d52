DROP TABLE {{table_keys}};
DROP TABLE {{table}};
