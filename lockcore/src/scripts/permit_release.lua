-- Gives a semaphore's permit (or a read lock's share) back and wakes its waiters (see
-- permit_acquire.lua, read_acquire.lua).
-- KEYS[1] the semaphore (the readers); KEYS[2], for a read lock, its lock key (where
-- `readers` stands while readers hold); ARGV[1] token; ARGV[2] the channel that wakes
-- waiters; ARGV[3] '1' to wake them only when the set is left empty (a read lock: only
-- a writer, a lock or a multi-lock waits for readers, and only for the last).
-- Returns 1 released; 0 when the set no longer holds the token, or its lease had ended
-- (the permit counted as free since: lost).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Read with pcall: a key of another kind (a lock that took the name since) holds no
-- permit of this holder's.
local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(ends) == 'table' then
  ends = false
end
if not ends then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
local live = tonumber(ends) > now
local released = 0
if live then
  released = 1
end
if ARGV[3] == '1' then
  -- Leases that ended count as gone: the last live holder wakes the waiters, and takes
  -- `readers` off the lock key.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('EXISTS', KEYS[1]) == 1 then
    -- Others still read: `readers` ends with the longest share left.
    if KEYS[2] and redis.pcall('GET', KEYS[2]) == 'readers' then
      local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', KEYS[2], math.max(tonumber(last[2]) - now, 1))
    end
    return released
  end
  if KEYS[2] and redis.pcall('GET', KEYS[2]) == 'readers' then
    redis.call('DEL', KEYS[2])
  end
else
  -- A semaphore: its limit (scored +inf, see permit_acquire.lua) does not keep the key
  -- once no live permit is left.
  if redis.call('ZCOUNT', KEYS[1], '(' .. now, '(+inf') == 0 then
    redis.call('DEL', KEYS[1])
  end
  if not live then
    return 0
  end
end
if redis.call('PUBSUB', 'NUMSUB', ARGV[2])[2] > 0 then
  redis.call('PUBLISH', ARGV[2], '1')
end
return released
