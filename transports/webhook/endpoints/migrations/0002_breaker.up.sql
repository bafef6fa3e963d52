-- The breaker state the webhook Sinks report. Each relay's Sink keeps one
-- breaker per endpoint in memory and writes it here on every change of
-- state (never per delivery): breaker_state is 'open', 'half-open' or
-- 'closed', breaker_since when the reporting Sink changed to it, and
-- breaker_relay which Sink (Config.Instance: host and process by default).
-- With several relays each has its own breaker and the last report wins.
-- NULL until a Sink's breaker first opened.
ALTER TABLE {{table}}
    ADD COLUMN breaker_state text CHECK (breaker_state IN ('open', 'half-open', 'closed')),
    ADD COLUMN breaker_since timestamptz,
    ADD COLUMN breaker_relay text;
