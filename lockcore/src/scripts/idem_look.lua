-- One look at an idempotency record (`Locks::idem_record`, `distlock idem show`):
-- read-only. KEYS[1] record key.
-- Returns {value or nil, PTTL, the server's time in ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), now}
