-- The console's expired leases (Store.ExpiredLeases) read this partial
-- index, which holds only the records IN_PROGRESS (status 1): leased
-- claims being worked on and those whose holder died. It stays as small as
-- the work in flight. A leased claim pays one index entry when it inserts
-- its record; Complete and Fail already write a new tuple (status is in
-- the dead letters' index predicate), which leaves this index; Extend
-- moves lease_until, so it is no longer a HOT update. Building it reads
-- the table once, under the migration's lock.
CREATE INDEX ON {{table}} (scope_id, lease_until) WHERE status = 1;
