-- Take a lock in one step. KEYS[1] lock key, KEYS[2] fencing counter (same slot).
-- ARGV[1] token, ARGV[2] ttl in ms.
-- Returns the new fencing token (>= 1), or 0 when someone else holds the lock.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
