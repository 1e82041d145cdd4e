-- Forget an idempotency record (`Locks::forget_idem`, `distlock idem forget`): delete
-- it and wake the repeats that wait on it, so that the next request under its key runs
-- the body. KEYS[1] record key; ARGV[1] the channel that wakes waiters.
-- Returns 1 deleted, 0 when there was no record, -1 when the key holds something else (a
-- lock's token, application data): nothing is deleted. A record is a claim in progress
-- (a JSON object whose status is `in_progress`) or holds a completed record (see
-- idem_claim.lua).
local raw = redis.call('GET', KEYS[1])
if not raw then
  return 0
end
if not string.find(raw, '{"status":"completed","fp":"', 1, true) then
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' or rec.status ~= 'in_progress' then
    return -1
  end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], '1')
return 1
