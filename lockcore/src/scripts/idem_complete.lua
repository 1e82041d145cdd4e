-- Store the result of a claimed record. KEYS[1] record key.
-- ARGV[1] owner token, ARGV[2] the completed record (JSON), ARGV[3] retention in ms,
-- ARGV[4] channel that wakes waiters.
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
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' or rec.status ~= 'in_progress' or rec.owner ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], '1')
return 1
