-- Back to the plain table: the rows of every partition but bucket 0 are
-- copied into it (the partitions of recent buckets; this takes as long as
-- they are big), then it takes the parent's place again.
DO $$
DECLARE
	parent regclass := '{{table}}';
	ns text;
	name text;
	p record;
BEGIN
	SELECT n.nspname, c.relname INTO ns, name
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = parent;

	IF to_regclass(format('%I.%I', ns, name || '_p0')) IS NULL THEN
		-- GC dropped bucket 0: an empty plain table takes its place.
		EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS)', ns, name || '_p0', ns, name);
	ELSE
		EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I', ns, name, ns, name || '_p0');
	END IF;
	EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT IF EXISTS idemq_bucket_0', ns, name || '_p0');
	EXECUTE format('INSERT INTO %I.%I SELECT * FROM %I.%I', ns, name || '_p0', ns, name);
	FOR p IN SELECT c.oid::regclass AS part FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = parent LOOP
		EXECUTE format('DROP TABLE %s', p.part);
	END LOOP;
	EXECUTE format('DROP TABLE %I.%I', ns, name);
	EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', ns, name || '_p0', name);
	IF to_regclass(format('%I.%I', ns, name || '_p0_pkey')) IS NOT NULL THEN
		EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', ns, name, name || '_p0_pkey');
	END IF;
	EXECUTE format('ALTER TABLE %I.%I DROP COLUMN bucket', ns, name);
	EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (scope_id, key_id)', ns, name);
	IF NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
			WHERE x.indrelid = format('%I.%I', ns, name)::regclass AND a.attname = 'expires_at') THEN
		EXECUTE format('CREATE INDEX ON %I.%I (expires_at)', ns, name);
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[1]
			WHERE x.indrelid = format('%I.%I', ns, name)::regclass AND x.indpred IS NOT NULL AND a.attname = 'updated_at') THEN
		EXECUTE format('CREATE INDEX ON %I.%I (scope_id, updated_at) WHERE status = 4', ns, name);
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[1]
			WHERE x.indrelid = format('%I.%I', ns, name)::regclass AND x.indpred IS NOT NULL AND a.attname = 'error_class') THEN
		EXECUTE format('CREATE INDEX ON %I.%I (scope_id, error_class, updated_at) WHERE status = 4', ns, name);
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[1]
			WHERE x.indrelid = format('%I.%I', ns, name)::regclass AND x.indpred IS NOT NULL AND a.attname = 'lease_until') THEN
		EXECUTE format('CREATE INDEX ON %I.%I (scope_id, lease_until) WHERE status = 1', ns, name);
	END IF;
END
$$;
