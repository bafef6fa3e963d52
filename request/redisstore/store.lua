-- One script for every operation of the Redis request store, so that
-- each is atomic and one round trip. KEYS[1] is the record hash (fields
-- f fingerprint, s state, t token, r response), KEYS[2] the lease key
-- (its value the token). ARGV[1] names the operation:
--
--   claim    fingerprint, lease ms, record TTL ms
--            -> {"acquired", token, lease until ms} or the record
--   complete token, record TTL ms, response -> {"ok", 0} or {"lost"}
--   release  token, record TTL ms           -> {"ok", 0} or {"lost"}
--   extend   token, lease ms                -> {"ok", lease until ms} or {"lost"}
--   get                                     -> the record or {"missing"}
--
-- A record reply is {"record", fingerprint, state, token, lease until ms,
-- expires at ms, response}. States: 1 in progress, 2 completed, 3 released.
-- Times come from the server's clock.

local op = ARGV[1]
local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now_ms = math.floor(now_us / 1000)

local function record()
	local rec = redis.call('HMGET', KEYS[1], 'f', 's', 't', 'r')
	if not rec[1] then
		return {'missing'}
	end
	local lease_until = now_ms
	local lease_left = redis.call('PTTL', KEYS[2])
	if lease_left > 0 then
		lease_until = now_ms + lease_left
	end
	local expires = now_ms + math.max(redis.call('PTTL', KEYS[1]), 0)
	return {'record', rec[1], tonumber(rec[2]), tonumber(rec[3]), lease_until, expires, rec[4] or ''}
end

if op == 'get' then
	return record()
end

if op == 'claim' then
	local rec = redis.call('HMGET', KEYS[1], 'f', 's', 't')
	if rec[1] and (rec[1] ~= ARGV[2] or rec[2] == '2') then
		return record() -- another request's key, or completed
	end
	if not rec[1] then
		-- A lease that outlived its record cannot finish (finishing checks
		-- the record): it holds nothing.
		redis.call('DEL', KEYS[2])
	end
	-- The token grows by one per claim, and never falls below the clock,
	-- so a record that expired and is created again still hands out
	-- larger tokens than any it handed out before.
	local token = string.format('%.0f', math.max((tonumber(rec[3]) or 0) + 1, now_us))
	if not redis.call('SET', KEYS[2], token, 'NX', 'PX', ARGV[3]) then
		return record() -- in flight under a live lease
	end
	redis.call('HSET', KEYS[1], 'f', ARGV[2], 's', 1, 't', token)
	redis.call('PEXPIRE', KEYS[1], ARGV[4])
	return {'acquired', token, now_ms + tonumber(ARGV[3])}
end

-- complete, release, extend: compare-and-set on state and token.
local rec = redis.call('HMGET', KEYS[1], 's', 't')
if rec[1] ~= '1' or rec[2] ~= ARGV[2] then
	return {'lost'}
end
if op == 'extend' then
	redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
	return {'ok', now_ms + tonumber(ARGV[3])}
end
if op == 'complete' then
	redis.call('HSET', KEYS[1], 's', 2, 'r', ARGV[4])
else
	redis.call('HSET', KEYS[1], 's', 3)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
return {'ok', 0}
