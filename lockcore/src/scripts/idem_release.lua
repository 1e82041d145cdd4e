-- Give up a claim so a retry runs the body. KEYS[1] record key.
-- ARGV[1] owner token, ARGV[2] channel that wakes waiters, published on only when a
-- waiting repeat marked the record (`waited`, see idem_claim.lua), ARGV[3] the retention
-- in ms (what is left of a kept record's ttl: its lease ended).
-- Returns 1 released, 0 when the record is gone or no longer this owner's claim.
-- A claim that took over an earlier one is not deleted: the earlier claimer may have run
-- its body with this fingerprint. The record stays in progress with its fingerprint and
-- no owner, its lease ended (its ttl is the retention): the same payload takes it over at
-- once, another payload is still a mismatch.
local raw = redis.call('GET', KEYS[1])
if not raw or string.find(raw, '{"status":"completed","fp":"', 1, true) then
  return 0
end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' or rec.status ~= 'in_progress' or rec.owner ~= ARGV[1] then
  return 0
end
if rec.took_over then
  rec.owner = ''
  rec.lease_until_ms = 0
  redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
if rec.waited then
  redis.call('PUBLISH', ARGV[2], '1')
end
return 1
