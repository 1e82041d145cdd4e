-- After a store whose `APPEND` did not find the exact record its claim wrote: a waiting
-- repeat marked the record, a renewal rewrote it, another call took it over or stored its
-- result first, the store was retried, or the key had gone (and another claim may have
-- been made since). Says whose result is stored, and wakes whoever waits.
-- KEYS[1] record key. ARGV[1] the completed record that was appended, ARGV[2] the channel
-- that wakes waiters, published on only when a waiting repeat marked the record
-- (`"waited":true`, see idem_claim.lua).
-- Returns 1 when ARGV[1] is the first completed record in the value (stored: by this
-- append or an earlier try of the same store), 0 when another call's result came first,
-- the key is gone, or the claim in front is another payload's: a claim made after the
-- key had gone, whose body runs with its own payload. That claim keeps its record (the
-- appended result is taken out again, its ttl kept), and this result is not stored.
local raw = redis.call('GET', KEYS[1])
if not raw then
  return 0
end
local mark = '{"status":"completed","fp":"'
local done = string.find(raw, mark, 1, true)
if not done or string.sub(raw, done, done + #ARGV[1] - 1) ~= ARGV[1] then
  return 0
end
local claim = string.sub(raw, 1, done - 1)
local fp = string.match(ARGV[1], '^{"status":"completed","fp":"(%x*)"')
if claim ~= '' and not string.find(claim, '"fp":"' .. tostring(fp) .. '"', 1, true) then
  redis.call('SET', KEYS[1], claim .. string.sub(raw, done + #ARGV[1]), 'KEEPTTL')
  return 0
end
if string.find(claim, '"waited":true', 1, true) then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
