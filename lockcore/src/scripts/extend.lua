-- Compare-and-extend. KEYS[1] lock key; ARGV[1] token, ARGV[2] new ttl in ms, or 0 to
-- keep the lease as it is and write its expiry again (a confirmation whose `WAIT` needs
-- a write of this connection's to count, and must not shorten the lease).
-- Returns 1 when extended (the value kept, a waiter's mark included), 0 when the key is
-- gone or holds another token.
-- Read with pcall: a key of another kind (a semaphore that took the name since) is not
-- this holder's, as a key gone is not (an error here would fail a whole renewal batch).
local held = redis.pcall('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  local ttl = tonumber(ARGV[2])
  if ttl == 0 then
    ttl = redis.call('PTTL', KEYS[1])
    if ttl <= 0 then
      return 1
    end
  end
  return redis.call('PEXPIRE', KEYS[1], ttl)
end
return 0
