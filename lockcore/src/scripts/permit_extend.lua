-- Compare-and-extend of a semaphore's permit (see permit_acquire.lua).
-- KEYS[1] the semaphore; ARGV[1] token, ARGV[2] new ttl in ms (shorter or longer).
-- Returns 1 when extended, 0 when the set no longer holds the token or its lease ended.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
