-- Compare-and-delete. KEYS[1] lock key, KEYS[2] its fencing counter (same slot).
-- ARGV[1] token, ARGV[2] channel that wakes waiters, ARGV[3] this acquisition's fence
-- when retrying a release whose reply was lost, else ''.
-- Returns 1 released now, 0 lost (the key is gone or holds another token). On a retry:
-- 2 when the key is gone and nobody has taken the lock since (the fence is unchanged:
-- the lost try released it, or it expired with no other holder), 3 when someone took it
-- since (whether the lost try released it first cannot be told).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
if ARGV[3] == '' then
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('GET', KEYS[2]) == ARGV[3] then
  return 2
end
return 3
