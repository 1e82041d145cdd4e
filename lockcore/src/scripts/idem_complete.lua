-- Store the result of a claimed record. KEYS[1] record key.
-- ARGV[1] owner token, ARGV[2] the completed record (JSON), ARGV[3] retention in ms,
-- ARGV[4] channel that wakes waiters, published on only when a waiting repeat marked the
-- record (`"waited":true`, see idem_claim.lua).
-- Returns 1 stored now, 2 stored by an earlier try of this same call (its reply was lost),
-- 0 lost (the record is gone, completed by someone else, or claimed by another owner).
local raw = redis.call('GET', KEYS[1])
if not raw then
  return 0
end
if string.sub(raw, 1, 22) == '{"status":"completed",' then
  if raw == ARGV[2] then
    return 2
  end
  return 0
end
-- `owned`: idem_owned.lua.
if not owned(raw, ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if string.find(raw, '"waited":true', 1, true) then
  redis.call('PUBLISH', ARGV[4], '1')
end
return 1
