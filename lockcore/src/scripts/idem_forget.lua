-- Forget an idempotency record (`Locks::forget_idem`, `distlock idem forget`): delete
-- it and wake the repeats that wait on it, so that the next request under its key runs
-- the body. KEYS[1] record key; ARGV[1] the channel that wakes waiters.
-- Returns 1 deleted, 0 when there was no record.
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
redis.call('PUBLISH', ARGV[1], '1')
return 1
