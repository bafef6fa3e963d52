-- The partitioned mode (Config.Partitioning): the inbox table becomes a
-- parent partitioned by RANGE (bucket), a bucket being a PartitionInterval
-- of arrival time (PartitionByArrival) or of a UUIDv7 key's own time
-- (PartitionByKey). Expiry drops a whole past partition: no DELETE, no
-- VACUUM, about no WAL.
--
-- The table as it was becomes the parent's first partition, bucket 0, so
-- that a live inbox keeps every record: claims go on finding its keys
-- until it holds nothing unexpired and GC drops it. Its new column has a
-- constant default (no rewrite). What would take long on a big table
-- under this migration's lock, the (scope_id, key_id, bucket) index and
-- the check that proves every row is bucket 0, Store.PrepareLivePartitioning
-- builds beforehand without blocking writers (idemq migrate
-- --inbox-partitioned runs it); this migration uses them when present.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS bucket int NOT NULL DEFAULT 0;

DO $$
DECLARE
	legacy regclass := '{{table}}';
	ns text;
	name text;
BEGIN
	SELECT n.nspname, c.relname INTO ns, name
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = legacy;

	IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = legacy AND conname = 'idemq_bucket_0') THEN
		EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT idemq_bucket_0 CHECK (bucket = 0)', ns, name);
	END IF;
	IF to_regclass(format('%I.%I', ns, name || '_bucket_key')) IS NULL THEN
		EXECUTE format('CREATE UNIQUE INDEX %I ON %I.%I (scope_id, key_id, bucket)', name || '_bucket_key', ns, name);
	END IF;
	EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT %I', ns, name, name || '_pkey');
	EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I PRIMARY KEY USING INDEX %I', ns, name, name || '_pkey', name || '_bucket_key');
	EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', ns, name, name || '_p0');
	EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', ns, name || '_pkey', name || '_p0_pkey');

	EXECUTE format('CREATE TABLE %I.%I (LIKE %I.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS, PRIMARY KEY (scope_id, key_id, bucket)) PARTITION BY RANGE (bucket)',
		ns, name, ns, name || '_p0');
	EXECUTE format('ALTER TABLE %I.%I DROP CONSTRAINT idemq_bucket_0', ns, name);
	-- Every insert names its bucket: a Store still on the plain Config
	-- fails here rather than writing records the partitioned claims miss.
	EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN bucket DROP DEFAULT', ns, name);
	-- The dead letters' partial index, on every partition; bucket 0 has it.
	EXECUTE format('CREATE INDEX ON %I.%I (scope_id, updated_at) WHERE status = 4', ns, name);
	-- And the index that groups them by error class (migration 0006).
	EXECUTE format('CREATE INDEX ON %I.%I (scope_id, error_class, updated_at) WHERE status = 4', ns, name);
	-- And the expired leases' index (migration 0007).
	EXECUTE format('CREATE INDEX ON %I.%I (scope_id, lease_until) WHERE status = 1', ns, name);
	EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I FOR VALUES FROM (MINVALUE) TO (1)', ns, name, ns, name || '_p0');
END
$$;
