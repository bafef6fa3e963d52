-- error_class groups dead letters by cause: the last error's text with its
-- variable parts (ids, numbers, addresses, times, quoted values) replaced
-- by placeholders and prefixed with the error type the text names (HTTP
-- status class, SQLSTATE, Kafka error code); see internal/errclass. The
-- relay writes it when it buries a row. Rows buried before this migration
-- keep NULL, shown and filtered as 'unclassified', until
-- outbox.Outbox.ClassifyDead (idemq dlq classify) fills it in from their
-- stored text in batches: a migration cannot run the Go function, and a
-- table rewrite here would hold the dead-letter table's lock for as long.
--
-- Grouping by class and destination, with the count, the first and last
-- failure and the oldest row as the sample, reads this index alone.
ALTER TABLE {{table_dead}} ADD COLUMN error_class text;

CREATE INDEX ON {{table_dead}} (error_class, destination, seq) INCLUDE (failed_at);
