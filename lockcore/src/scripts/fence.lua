-- The fencing token of a held lock. KEYS[1] lock key, KEYS[2] its fencing counter (same
-- slot); ARGV[1] the holder's token. Returns the next value of the counter when the key
-- holds the token (marked by a waiter or not), else 0 (the lock is lost).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  return redis.call('INCR', KEYS[2])
end
return 0
