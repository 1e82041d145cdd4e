-- After a store whose `APPEND` did not return the length its owner expected: something
-- other than the exact record the claim wrote was there before it (a waiting repeat
-- marked the record, a renewal rewrote it, another call took it over or completed first,
-- or the key had gone), so say whose result is stored and wake whoever waits.
-- KEYS[1] record key. ARGV[1] the completed record that was appended, ARGV[2] the channel
-- that wakes waiters, published on only when a waiting repeat marked the record
-- (`"waited":true`, see idem_claim.lua).
-- Returns 1 when ARGV[1] is the first completed record in the value (stored: by this
-- append or an earlier try of the same store), 0 when another call's result came first
-- (or the key is gone: nothing of this store is left).
local raw = redis.call('GET', KEYS[1])
if not raw then
  return 0
end
local done = string.find(raw, '{"status":"completed","fp":"', 1, true)
if not done or string.sub(raw, done, done + #ARGV[1] - 1) ~= ARGV[1] then
  return 0
end
if string.find(string.sub(raw, 1, done - 1), '"waited":true', 1, true) then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
