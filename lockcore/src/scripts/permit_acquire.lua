-- A try for one of a semaphore's permits. The semaphore is a sorted set of its holders'
-- tokens, each scored by when its lease ends (the server's clock, ms since the epoch);
-- a lease that has ended frees its permit, whoever notices first removes it.
-- KEYS[1] the semaphore. ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] how many permits
-- this caller counts (a holder taken under a larger count keeps its permit: the smaller
-- count applies as permits are given back).
-- Returns 0 when taken (also when the set holds this token already: an earlier try of
-- the same caller took it, its reply lost); else how long until the first lease ends,
-- in ms (at least 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ttl = tonumber(ARGV[2])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3])
    or redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 0
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(tonumber(first[2]) - now, 1)
