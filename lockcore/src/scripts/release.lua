-- Release in one step: compare-and-delete, or hand the lock to this client's next local
-- waiter, or leave it to the other clients that wait for it.
-- KEYS[1] lock key, KEYS[2] its fencing counter (same slot).
-- ARGV[1] token; ARGV[2] the channel that wakes waiters; ARGV[3] this acquisition's fence
-- when retrying a release whose reply was lost, else ''; ARGV[4] this client's yield
-- marker, '' to never yield; ARGV[5] the yield window in ms; ARGV[6] the token of the
-- next local waiter, else ''; ARGV[7] its ttl in ms; ARGV[8] '1' when this client's turn
-- is over (the next local waiter gets the lock only if no other client waits); ARGV[9]
-- how many of the channel's subscribers are this client's own (0 or 1).
-- Returns {1} released, {0} lost (the key is gone or holds another token), {4, fence}
-- handed to the next local waiter. On a retry: {2} when the key is gone (or holds this
-- client's yield marker) and nobody has taken the lock since (the fence is unchanged),
-- {3} when someone took it since (whether the lost try released it first cannot be told).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  if ARGV[6] ~= '' and ARGV[8] ~= '1' then
    redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[7])
    return {4, redis.call('INCR', KEYS[2])}
  end
  local others = redis.call('PUBLISH', ARGV[2], '1') - tonumber(ARGV[9])
  if ARGV[6] ~= '' and others < 1 then
    redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[7])
    return {4, redis.call('INCR', KEYS[2])}
  end
  if ARGV[4] ~= '' and others > 0 then
    redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
  else
    redis.call('DEL', KEYS[1])
  end
  return {1}
end
if ARGV[3] == '' then
  return {0}
end
if ARGV[6] ~= '' and held == ARGV[6] then
  return {4, tonumber(redis.call('GET', KEYS[2]))}
end
if (not held or (ARGV[4] ~= '' and held == ARGV[4])) and redis.call('GET', KEYS[2]) == ARGV[3] then
  return {2}
end
return {3}
