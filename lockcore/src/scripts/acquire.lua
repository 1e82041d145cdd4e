-- A contended try (a free key is taken with a plain `SET key token NX PX ttl GET`; this
-- script runs when that found something, and for waiters).
-- KEYS[1] lock key. ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] this client's id, ARGV[4]
-- '1' when the caller will be woken by a message: it then marks the holder's value
-- (`<token> waiting`, with APPEND, which keeps the ttl), so the holder's release knows
-- to wake it.
-- Returns 0 when taken; when someone else holds the lock, the holder's remaining ttl in
-- ms (-1 when it has none); when readers hold it, -2 minus their remaining ttl.
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
-- Our own token: a release handed the lock to this caller (its client's next local
-- waiter), but the reply never reached the releaser, which told the caller to contend.
-- It holds the lock; the lease starts again now, as the caller counts it.
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 0
end
-- `readers`: a read lock's readers hold the name (see read_acquire.lua): wait for them
-- (the last one to leave deletes it and wakes the waiters; it ends with their leases).
-- Answered as `-2 - <ms left>`: the caller tries as a writer from then on
-- (write_acquire.lua), so that new readers queue behind it. (Never reached inside
-- write_acquire.lua, which takes a stale `readers` off before this try.)
if held == 'readers' then
  return -2 - math.max(redis.call('PTTL', KEYS[1]), 0)
end
-- A yield marker `yield: <id> <id> ... `: released while other clients waited, and left
-- to them for a short window. Free for every client it does not name (the releaser and
-- the clients that had the previous turns).
-- The clients it names still wait: the value is marked for them at once.
if string.sub(held, 1, 7) == 'yield: '
    and not string.find(held, ' ' .. ARGV[3] .. ' ', 7, true) then
  redis.call('SET', KEYS[1], ARGV[1] .. ' waiting', 'PX', ARGV[2])
  return 0
end
-- Held: tell the holder's release that someone waits for a message (a yield marker is
-- left alone: it ends by itself, and the next holder's value is marked then).
if ARGV[4] == '1' and string.sub(held, 1, 7) ~= 'yield: '
    and string.sub(held, -8) ~= ' waiting' then
  redis.call('APPEND', KEYS[1], ' waiting')
end
local left = redis.call('PTTL', KEYS[1])
if left < 1 then
  return -1
end
return left
