-- Compare-and-extend of a semaphore's permit or a read lock's share (see
-- permit_acquire.lua, read_acquire.lua).
-- KEYS[1] the semaphore (the readers); KEYS[2], for a read lock, its lock key, whose
-- `readers` is kept until the longest share ends; ARGV[1] token, ARGV[2] new ttl in ms
-- (shorter or longer), or 0 to keep the lease as it is and write the set's expiry again
-- (a confirmation whose `WAIT` needs a write of this connection's to count).
-- Returns 1 when extended, 0 when the set no longer holds the token or its lease ended.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Read with pcall: a key of another kind (a lock that took the name since) holds no
-- permit of this holder's.
local ends = redis.pcall('ZSCORE', KEYS[1], ARGV[1])
if type(ends) == 'table' then
  ends = false
end
if not ends or tonumber(ends) <= now then
  return 0
end
local ttl = tonumber(ARGV[2])
if ttl == 0 then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then
    redis.call('PEXPIRE', KEYS[1], left)
  end
  return 1
end
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
if KEYS[2] then
  local mark = redis.pcall('GET', KEYS[2])
  if type(mark) == 'table' then
    return 1
  end
  -- It ends with the longest share, to the millisecond (a shorter renewal shortens it).
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local left = math.max(tonumber(last[2]) - now, 1)
  if not mark then
    redis.call('SET', KEYS[2], 'readers', 'PX', left)
  elseif mark == 'readers' then
    redis.call('PEXPIRE', KEYS[2], left)
  end
end
return 1
