DROP TABLE {{table}};
DROP TABLE {{table_scopes}};
