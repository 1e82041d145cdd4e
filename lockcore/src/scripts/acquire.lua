-- Take a lock in one step. KEYS[1] lock key, KEYS[2] fencing counter (same slot).
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] this client's id.
-- Returns the fencing token (>= 1) when taken (the current one when the key already
-- holds this token); when someone else holds the lock, minus the holder's remaining ttl
-- in ms (-1 when it has none).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
local held = redis.call('GET', KEYS[1])
-- Our own token: a release handed the lock to this caller (its client's next local
-- waiter), but the reply never reached the releaser, which told the caller to contend.
-- It holds the lock; the lease starts again now, as the caller counts it.
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2])) or redis.call('INCR', KEYS[2])
end
-- A yield marker `yield: <id> <id> ... `: released while other clients waited, and left
-- to them for a short window. Free for every client it does not name (the releaser and
-- the clients that had the previous turns).
if held and string.sub(held, 1, 7) == 'yield: '
    and not string.find(held, ' ' .. ARGV[3] .. ' ', 7, true) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return redis.call('INCR', KEYS[2])
end
local left = redis.call('PTTL', KEYS[1])
if left < 1 then
  return -1
end
return -left
