-- A try for a share of a read lock. KEYS[1] the lock key, where a writer holds its
-- token (as acquire.lua; a read/write lock's writer never leaves a yield marker);
-- KEYS[2] the readers: a sorted set of their tokens, each scored by when its lease ends
-- (the server's clock, ms since the epoch); KEYS[3] the writer-waiting mark: the token of
-- a writer that waits, with a short ttl (see write_acquire.lua); KEYS[4] the readers
-- that wait behind a writer that holds: a sorted set of their tokens, scored by when
-- each stops counting (its mark's end).
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' when the caller will be woken by a
-- message: it then marks a writer's value (`<token> waiting`), so the writer's release
-- wakes it; ARGV[4] how long this reader counts as waiting, in ms (0: it will not try
-- again, so it does not count).
-- Returns 0 when taken (also when the readers hold this token already: an earlier try
-- of the same caller took it, its reply lost); else how long until it may be free, in ms
-- (-1 when unknown).
-- While readers hold, the lock key holds `readers` (never a token), with a ttl that ends
-- with the longest reader's lease: a lock, a write lock and a multi-lock of the same name
-- find it held and wait (acquire.lua), as they would for a writer.
-- Turns alternate. A writer that waits comes before new readers: they queue behind it
-- (its mark). Readers that waited behind a writer come before the next writer once it
-- releases: while one of them has not come in, writers are kept out, and they pass a
-- waiting writer's mark.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local ttl = tonumber(ARGV[2])
local function take()
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[2]) < ttl then
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  -- `readers` lasts as long as the longest share, to the millisecond.
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local left = math.max(tonumber(last[2]) - now, 1)
  local mark = redis.call('GET', KEYS[1])
  if not mark then
    redis.call('SET', KEYS[1], 'readers', 'PX', left)
  elseif mark == 'readers' then
    redis.call('PEXPIRE', KEYS[1], left)
  end
  return 0
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return take()
end
local held = redis.call('GET', KEYS[1])
if held == 'readers' then
  held = false
end
if held then
  if ARGV[3] == '1' and string.sub(held, -8) ~= ' waiting' then
    redis.call('APPEND', KEYS[1], ' waiting')
  end
  local waiting = tonumber(ARGV[4])
  if waiting > 0 then
    redis.call('ZADD', KEYS[4], now + waiting, ARGV[1])
    if redis.call('PTTL', KEYS[4]) < waiting then
      redis.call('PEXPIRE', KEYS[4], waiting)
    end
  end
  local left = redis.call('PTTL', KEYS[1])
  if left < 1 then
    return -1
  end
  return left
end
local writer = redis.call('PTTL', KEYS[3])
if writer > 0 and not redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  return writer
end
return take()
