-- A fence in one script. KEYS[1] lock key, KEYS[2] its fence counter; ARGV[1] token.
-- Returns the next fence while the key holds the token (a waiter's mark included), else
-- nil: the lock is lost.
-- A counter made afresh (the first fence of a name, or after a restart that kept
-- nothing) starts from the server's clock in microseconds since the epoch, so every fence
-- it gives is above every fence an earlier counter of the name gave (fewer than one a
-- microsecond), and fences never go backwards, with or without persistence.
-- Read with pcall: a key of another kind (a semaphore that took the name since) is not
-- this holder's, as a key gone is not (an error here would fail a whole renewal batch).
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
  end
  return redis.call('INCR', KEYS[2])
end
return false
