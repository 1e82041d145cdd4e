-- Extend a claim's lease (heartbeat while the body runs). KEYS[1] record key.
-- ARGV[1] owner token, ARGV[2] lease in ms, ARGV[3] lifetime of the key in ms (lease +
-- retention: the lease is the key's ttl minus the retention, see idem_claim.lua).
-- Returns 1 renewed, 0 when the record is gone or no longer this owner's claim.
local raw = redis.call('GET', KEYS[1])
if not raw or string.find(raw, '{"status":"completed","fp":"', 1, true) then
  return 0
end
-- `owned`: idem_owned.lua.
if not owned(raw, ARGV[1]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local renewed = string.gsub(raw, '"lease_until_ms":%d+', '"lease_until_ms":' .. (now + tonumber(ARGV[2])), 1)
redis.call('SET', KEYS[1], renewed, 'PX', ARGV[3])
return 1
