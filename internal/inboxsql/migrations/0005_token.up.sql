-- token is the fencing token of leased claims (Acquire), apart from
-- attempts, which goes on counting claims. Every claim sets it to the
-- larger of the previous token + 1 and the server's clock in microseconds,
-- so that a record GC deleted and a claim created again hands out larger
-- tokens than any it handed out before. NULL (never leased) costs nothing.
--
-- Older versions fence on attempts and leave token alone: a takeover by one
-- of them does not fence out a holder of this version, so run leased
-- consumers and request stores of one version at a time across it.
ALTER TABLE {{table}} ADD COLUMN token bigint;
