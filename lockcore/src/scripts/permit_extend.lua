-- Compare-and-extend of a semaphore's permit or a read lock's share (see
-- permit_acquire.lua, read_acquire.lua).
-- KEYS[1] the semaphore (the readers); KEYS[2], for a read lock, its lock key, whose
-- `readers` is kept at least as long as the share; ARGV[1] token, ARGV[2] new ttl in ms
-- (shorter or longer).
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
if KEYS[2] then
  local mark = redis.call('GET', KEYS[2])
  if not mark then
    redis.call('SET', KEYS[2], 'readers', 'PX', ttl)
  elseif mark == 'readers' and redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
end
return 1
