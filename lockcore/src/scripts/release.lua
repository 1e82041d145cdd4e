-- Release in one step: compare-and-delete, or hand the lock to this client's next local
-- waiter, or leave it to the other clients that wait for it; then wake the waiters.
-- KEYS[1] lock key, KEYS[2] its fencing counter, KEYS[3] the recent turns (same slot).
-- ARGV[1] token; ARGV[2] the channel that wakes waiters; ARGV[3] this acquisition's fence
-- when retrying a release whose reply was lost, else ''; ARGV[4] this client's id, ''
-- to never yield; ARGV[5] the yield window in ms; ARGV[6] the token of the next local
-- waiter, else ''; ARGV[7] its ttl in ms; ARGV[8] '1' when this client's turn is over
-- (the next local waiter gets the lock only if no other client waits); ARGV[9] how many
-- of the channel's subscribers are this client's own (0 or 1).
-- Returns {1} released, {5} released and left to the other clients for the yield window,
-- {0} lost (the key is gone or holds another token), {4, fence} handed to the next local
-- waiter. On a retry: {2} when the key is gone (or holds this
-- client's yield marker) and nobody has taken the lock since (the fence is unchanged),
-- {3} when someone took it since (whether the lost try released it first cannot be told).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  if ARGV[6] ~= '' and ARGV[8] ~= '1' then
    redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[7])
    return {4, redis.call('INCR', KEYS[2])}
  end
  local listening = redis.call('PUBSUB', 'NUMSUB', ARGV[2])[2]
  local others = listening - tonumber(ARGV[9])
  if ARGV[6] ~= '' and others < 1 then
    redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[7])
    return {4, redis.call('INCR', KEYS[2])}
  end
  local message = '1'
  if ARGV[4] ~= '' and others > 0 then
    -- Yield: name this client and the clients of the latest turns, at most one fewer
    -- than the clients waiting, so the one that has waited longest goes next.
    local names = {ARGV[4]}
    local keep = others - 1
    for id in string.gmatch(redis.call('GET', KEYS[3]) or '', '%S+') do
      if keep < 1 then
        break
      end
      if id ~= ARGV[4] then
        names[#names + 1] = id
        keep = keep - 1
      end
    end
    local turns = table.concat(names, ' ')
    message = 'yield: ' .. turns .. ' '
    redis.call('SET', KEYS[1], message, 'PX', ARGV[5])
    redis.call('SET', KEYS[3], turns, 'PX', 60000)
  else
    redis.call('DEL', KEYS[1])
  end
  -- The message wakes the waiters; a yield names the clients that cannot take it, so
  -- their waiters stay asleep.
  if listening > 0 then
    redis.call('PUBLISH', ARGV[2], message)
  end
  if message ~= '1' then
    return {5}
  end
  return {1}
end
if ARGV[3] == '' then
  return {0}
end
if ARGV[6] ~= '' and held == ARGV[6] then
  return {4, tonumber(redis.call('GET', KEYS[2]))}
end
local mine = ARGV[4] ~= '' and held and string.sub(held, 1, 8 + #ARGV[4]) == 'yield: ' .. ARGV[4] .. ' '
if (not held or mine) and redis.call('GET', KEYS[2]) == ARGV[3] then
  return {2}
end
return {3}
