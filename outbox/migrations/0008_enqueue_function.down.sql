DROP FUNCTION {{table_enqueue}}(text, text, bytea, jsonb);
