-- Back to the (key, seq) index of the head probe. Relays of the version
-- that leased partitions must be stopped first: the lease tables go.
CREATE INDEX ON {{table}} (key, seq) WHERE key IS NOT NULL;

DROP INDEX {{table_coalesce_seq_idx}};

DROP TABLE {{table_lease}};
DROP TABLE {{table_relays}};
