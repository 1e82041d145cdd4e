-- A fence in one script. KEYS[1] lock key, KEYS[2] its fence counter; ARGV[1] token,
-- ARGV[2] the counter's idle window in milliseconds. Returns the next fence while the
-- key holds the token (a waiter's mark included), else nil: the lock is lost.
-- Every fence is max(counter + 1, the server's clock in microseconds since the epoch), so
-- fences follow the clock, and the counter expires once the name has given no fence for
-- the idle window. A counter made afresh (the first fence of a name, or after it expired,
-- or after a restart that kept nothing) starts from the clock, above every fence an
-- earlier counter of the name gave as long as those ran less than the idle window (a
-- restart: less than the time the server was down) ahead of the clock, which fewer than
-- one fence a microsecond on average keeps them from doing, and the clock did not step
-- back by more than the rest. Fences never go backwards, with or without persistence.
-- `next_fence`: fence_next.lua.
-- Read with pcall: a key of another kind (a semaphore that took the name since) is not
-- this holder's, as a key gone is not (an error here would fail a whole renewal batch).
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  return next_fence(KEYS[2], ARGV[2])
end
return false
