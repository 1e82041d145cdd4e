-- The uncontended release: a compare-and-delete, unless a waiter marked the value.
-- KEYS[1] lock key; ARGV[1] token.
-- Returns 1 released, 0 lost (the key is gone or holds another token), 2 still held:
-- a waiter marked it (`<token> waiting`), so the caller runs `release.lua` to wake the
-- waiters or yield.
-- Read with pcall: a key of another kind (a semaphore that took the name since) is not
-- this holder's, as a key gone is not (an error here would fail a whole renewal batch).
local held = redis.pcall('GET', KEYS[1])
-- Kept for `min_hold` (keep.lua) by this holder: still its own.
if held == ARGV[1] .. ' kept' then
  held = ARGV[1]
elseif held == ARGV[1] .. ' kept waiting' then
  held = ARGV[1] .. ' waiting'
end
if held == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if held == ARGV[1] .. ' waiting' then
  return 2
end
return 0
