-- A try for one of a semaphore's permits. The semaphore is a sorted set of its holders'
-- tokens, each scored by when its lease ends (the server's clock, ms since the epoch);
-- a lease that has ended frees its permit, whoever notices first removes it.
-- The set also stores the limit (`key::limit_member`): one member scored +inf, which no
-- lease's end is, so the permits held are the members scored below +inf.
-- KEYS[1] the semaphore. ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] how many permits
-- this caller counts (a holder taken under a larger count keeps its permit: the smaller
-- count applies as permits are given back), ARGV[4] that count as the limit's member
-- (written when taken: the set shows the limit of the latest acquire that took a permit).
-- Returns 0 when taken (also when the set holds this token already: an earlier try of
-- the same caller took it, its reply lost); else how long until the first lease ends,
-- in ms (at least 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local ttl = tonumber(ARGV[2])
if redis.call('ZCOUNT', KEYS[1], '-inf', '(+inf') < tonumber(ARGV[3])
    or redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if not redis.call('ZSCORE', KEYS[1], ARGV[4]) then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '+inf', '+inf')
    redis.call('ZADD', KEYS[1], '+inf', ARGV[4])
  end
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return 0
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(tonumber(first[2]) - now, 1)
