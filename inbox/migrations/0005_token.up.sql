-- token is the fencing token of leased claims (Acquire), apart from
-- attempts, which goes on counting claims. Every claim sets it to the
-- larger of the previous token + 1 and the server's clock in microseconds,
-- so that a record GC deleted and a claim created again hands out larger
-- tokens than any it handed out before. NULL (never leased) costs nothing.
ALTER TABLE {{table}} ADD COLUMN token bigint;
