DROP TABLE {{table_audit}};
