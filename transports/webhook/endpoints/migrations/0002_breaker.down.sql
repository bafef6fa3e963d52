ALTER TABLE {{table}}
    DROP COLUMN breaker_relay,
    DROP COLUMN breaker_since,
    DROP COLUMN breaker_state;
