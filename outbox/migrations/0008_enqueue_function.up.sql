-- {{table}}_enqueue(destination, key, payload, headers) enqueues one message
-- from SQL, inside the caller's transaction, and returns its id: for
-- services in other languages, triggers on business tables and data
-- migrations, which cannot call outbox.Outbox.EnqueueTx. It writes what
-- EnqueueTx writes for outbox.Message{Destination, Key, Payload, Headers},
-- and refuses what EnqueueTx refuses, with an error instead of a row:
--
--   destination  required, 1 to 1024 bytes;
--   key          the ordering key, at most 1024 bytes; NULL or '' is
--                unordered;
--   payload      required (pass '' for an empty one), at most the
--                idemq.max_payload setting in bytes (1 MiB when unset,
--                outbox.Config.MaxPayload's default; ALTER DATABASE ... SET
--                idemq.max_payload = ... raises it);
--   headers      NULL or a JSON object of strings: names HTTP tokens,
--                values without CR or LF, at most 64 KiB as JSON text.
--
-- The id is a UUIDv7, the message id downstream; seq, and with it the
-- message's place in its key's order, comes from the table's identity at
-- insert time, as for rows written by Go; the relay computes the key's
-- partition. The function notifies the relays on the outbox's default
-- channel (outbox.Config.Channel's default: the table name, "schema.table"
-- outside public, shortened with an FNV-1a hash past 63 bytes), at commit,
-- at most once per idemq.notify_interval_ms (5 by default, as
-- outbox.Config.NotifyInterval; negative: every transaction) per session
-- and channel, for the reason the outbox package documentation gives under
-- Notifications: the relays poll for a while after each wake-up and find
-- the rows of the transactions that skipped theirs. The time of the last
-- NOTIFY is a session setting, which a rollback restores. Relays
-- configured with another channel find these rows by polling. SET
-- idemq.notify = off where transactions are prepared for a two-phase
-- commit (outbox.Config.DisableNotify).
--
-- The function runs with the caller's rights: granting INSERT on the outbox
-- table and EXECUTE on the function lets a role enqueue.
CREATE FUNCTION {{table_enqueue}}(destination text, key text, payload bytea, headers jsonb DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_variable
DECLARE
    fn          constant text := '{{table_enqueue}}';
    names       constant text[] := parse_ident('{{table}}');
    max_payload bigint := coalesce(nullif(current_setting('idemq.max_payload', true), '')::bigint, 1048576);
    channel     text;
    last_notify text;
    now_ms      float8;
    hash        bigint := 2166136261;
    bad         text;
    id          uuid;
BEGIN
    IF destination IS NULL OR payload IS NULL THEN
        RAISE EXCEPTION '%: % is NULL', fn, CASE WHEN destination IS NULL THEN 'destination' ELSE 'payload' END
            USING ERRCODE = 'null_value_not_allowed', HINT = 'pass '''' for an empty payload';
    END IF;
    IF destination = '' OR octet_length(destination) > 1024 THEN
        RAISE EXCEPTION '%: destination: % bytes, want 1 to 1024', fn, octet_length(destination)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(key) > 1024 THEN
        RAISE EXCEPTION '%: key: % bytes, limit 1024', fn, octet_length(key)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(payload) > max_payload THEN
        RAISE EXCEPTION '%: payload: % bytes, limit %', fn, octet_length(payload), max_payload
            USING ERRCODE = 'program_limit_exceeded', HINT = 'the limit is the idemq.max_payload setting';
    END IF;
    IF headers IS NOT NULL THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            RAISE EXCEPTION '%: headers: a JSON %, want an object of strings', fn, jsonb_typeof(headers)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT h.name INTO bad FROM jsonb_each(headers) AS h(name, value)
        WHERE h.name !~ '^[-!#$%&''*+.^_`|~0-9A-Za-z]+$' OR jsonb_typeof(h.value) <> 'string'
            OR h.value #>> '{}' ~ '[\r\n]'
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION '%: headers: %: want a name that is an HTTP token and a string value without CR or LF', fn, bad
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF octet_length(headers::text) > 65536 THEN
            RAISE EXCEPTION '%: headers: % bytes as JSON, limit 65536', fn, octet_length(headers::text)
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
        IF headers = '{}' THEN
            headers := NULL;
        END IF;
    END IF;

    -- A UUIDv7: 48 bits of Unix milliseconds over a random UUID, version 7.
    id := encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
            PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
            FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid;
    INSERT INTO {{table}} (id, destination, key, payload, headers)
    VALUES (id, destination, nullif(key, ''), payload, headers);

    IF coalesce(current_setting('idemq.notify', true), '') <> 'off' THEN
        channel := CASE WHEN names[1] = 'public' THEN names[2] ELSE names[1] || '.' || names[2] END;
        IF octet_length(channel) > 63 THEN
            FOR i IN 0 .. octet_length(channel) - 1 LOOP
                hash := ((hash # get_byte(convert_to(channel, 'UTF8'), i)) * 16777619) % 4294967296;
            END LOOP;
            channel := left(channel, 54) || '_' || lpad(to_hex(hash), 8, '0');
        END IF;
        -- The session's last NOTIFY on channel, in Unix milliseconds.
        last_notify := 'idemq.notified_' || left(md5(channel), 16);
        now_ms := floor(extract(epoch FROM clock_timestamp()) * 1000);
        IF now_ms - coalesce(nullif(current_setting(last_notify, true), '')::float8, '-Infinity')
            >= coalesce(nullif(current_setting('idemq.notify_interval_ms', true), '')::float8, 5) THEN
            PERFORM pg_notify(channel, '');
            PERFORM set_config(last_notify, now_ms::text, false);
        END IF;
    END IF;
    RETURN id;
END
$fn$;
