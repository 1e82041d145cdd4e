-- Release in one step: compare-and-delete, or hand the lock to this client's next local
-- waiter, or leave it to the other clients that wait for it; then wake the waiters.
-- KEYS[1] lock key, KEYS[2] the recent turns (same slot; left out, with ARGV[3] = '', by a
-- release that runs while a migrating slot has the two split between its nodes).
-- ARGV[1] token; ARGV[2] the channel that wakes waiters; ARGV[3] this client's id, ''
-- to never yield; ARGV[4] the yield window in ms; ARGV[5] the token of the next local
-- waiter, else ''; ARGV[6] its ttl in ms; ARGV[7] '1' when this client's turn is over
-- (the next local waiter gets the lock only if no other client waits); ARGV[8] how many
-- of the channel's subscribers are this client's own (0 or 1).
-- Returns 1 released, 5 released and left to the other clients for the yield window,
-- 4 handed to the next local waiter (also when the key already holds that waiter's
-- token: only this release's handoff writes it), 0 when the key is gone or holds
-- another token (the caller tells a lost lock from a retry of a release that happened).
-- A token may carry a waiter's mark (`<token> waiting`, see acquire.lua).
-- Read with pcall: a key of another kind (a semaphore that took the name since) is not
-- this holder's, as a key gone is not (an error here would fail a whole renewal batch).
local held = redis.pcall('GET', KEYS[1])
-- Kept for `min_hold` (keep.lua) by this holder: still its own.
if held == ARGV[1] .. ' kept' or held == ARGV[1] .. ' kept waiting' then
  held = ARGV[1]
end
if held ~= ARGV[1] and held ~= ARGV[1] .. ' waiting' then
  if ARGV[5] ~= '' and (held == ARGV[5] or held == ARGV[5] .. ' waiting') then
    return 4
  end
  return 0
end
if ARGV[5] ~= '' and ARGV[7] ~= '1' then
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
  return 4
end
local listening = redis.call('PUBSUB', 'NUMSUB', ARGV[2])[2]
local others = listening - tonumber(ARGV[8])
if ARGV[5] ~= '' and others < 1 then
  redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
  return 4
end
local message = '1'
if ARGV[3] ~= '' and others > 0 then
  -- Yield: name this client and the clients of the latest turns, at most one fewer
  -- than the clients waiting, so the one that has waited longest goes next.
  local names = {ARGV[3]}
  local keep = others - 1
  for id in string.gmatch(redis.call('GET', KEYS[2]) or '', '%S+') do
    if keep < 1 then
      break
    end
    if id ~= ARGV[3] then
      names[#names + 1] = id
      keep = keep - 1
    end
  end
  local turns = table.concat(names, ' ')
  message = 'yield: ' .. turns .. ' '
  redis.call('SET', KEYS[1], message, 'PX', ARGV[4])
  redis.call('SET', KEYS[2], turns, 'PX', 60000)
else
  redis.call('DEL', KEYS[1])
end
-- The message wakes the waiters; a yield names the clients that cannot take it, so
-- their waiters stay asleep.
if listening > 0 then
  redis.call('PUBLISH', ARGV[2], message)
end
if message ~= '1' then
  return 5
end
return 1
