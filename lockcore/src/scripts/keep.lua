-- A release before `min_hold` has run out: the lock kept until then, handed to nobody.
-- KEYS[1] lock key; ARGV[1] token, ARGV[2] the lease left in ms.
-- The value becomes `<token> kept`: the holder is done with it, and a renewal of the
-- holder's still in flight (extend.lua, a native `SET ... IFEQ`) no longer finds its
-- token, so it cannot set the lease back to its ttl. A release that follows (`min_hold`
-- passed while a keep's reply was lost) still finds it its own (release.lua).
-- Returns 1 kept (also when an earlier try of this keep did), 0 when the key is gone or
-- holds another token.
-- Read with pcall: a key of another kind (a semaphore that took the name since) is not
-- this holder's, as a key gone is not (an error here would fail a whole renewal batch).
local held = redis.pcall('GET', KEYS[1])
local kept = ARGV[1] .. ' kept'
if held == ARGV[1] or held == ARGV[1] .. ' waiting' or held == kept
    or held == kept .. ' waiting' then
  redis.call('SET', KEYS[1], kept, 'PX', ARGV[2])
  return 1
end
return 0
