-- The rows parked behind a dead letter of their key (available_at
-- 'infinity', relay option ParkFollowers), by destination: the console's
-- overview counts them exactly from this index alone, however large the
-- backlog. Only parked rows enter it, so an enqueue pays nothing for it
-- beyond evaluating the predicate, and the relay's claim never reads it.
CREATE INDEX ON {{table}} (destination) WHERE available_at = 'infinity';
