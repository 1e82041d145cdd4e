-- Releases whatever holds a lock, a semaphore or a read/write lock, and wakes its
-- waiters: an operator's last resort for a stuck holder, which then finds its lock gone
-- (`Lost`) at its release or next renewal.
-- KEYS[1] the key, KEYS[2] its readers, KEYS[3] a waiting writer's mark, KEYS[4] the
-- readers that wait; ARGV[1] the channel.
-- Returns how many of the keys existed (0: nothing held it).
local n = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
if n > 0 and redis.call('PUBSUB', 'NUMSUB', ARGV[1])[2] > 0 then
  redis.call('PUBLISH', ARGV[1], '1')
end
return n
