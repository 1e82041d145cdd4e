-- A look at the head of an idempotency record (`Locks::stuck_idem_records`, `distlock
-- leaks`): read-only, and only the first bytes of the value, so that a large stored
-- result is neither sent nor read by the caller. KEYS[1] record key, ARGV[1] how many
-- bytes to send.
-- Returns {the value's first ARGV[1] bytes or nil, the value's length, PTTL, the
-- server's time in ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {false, 0, -2, now}
end
local head = redis.call('GETRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
return {head, redis.call('STRLEN', KEYS[1]), redis.call('PTTL', KEYS[1]), now}
