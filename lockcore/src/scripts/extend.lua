-- Compare-and-extend. KEYS[1] lock key; ARGV[1] token, ARGV[2] new ttl in ms.
-- Returns 1 when extended (the value kept, a waiter's mark included), 0 when the key is
-- gone or holds another token.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
