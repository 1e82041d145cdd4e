-- Compare-and-delete. KEYS[1] lock key, KEYS[2] release marker for this token (same slot).
-- ARGV[1] token, ARGV[2] marker lifetime in ms, ARGV[3] channel that wakes waiters.
-- Returns 1 released now, 2 released by an earlier try of this same release
-- (its reply was lost), 0 lost (the key is gone or holds another token).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  redis.call('PUBLISH', ARGV[3], '1')
  return 1
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 2
end
return 0
