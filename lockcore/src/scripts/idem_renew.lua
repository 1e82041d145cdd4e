-- Extend a claim's lease (heartbeat while the body runs). KEYS[1] record key.
-- ARGV[1] owner token, ARGV[2] lease in ms, ARGV[3] lifetime of the key in ms (lease +
-- retention: the lease is the key's ttl minus the retention, see idem_claim.lua),
-- ARGV[4] the claim's payload fingerprint.
-- Returns 1 renewed, 2 written again: the record was gone (a restart that kept nothing,
-- a failover that lost it, eviction, a forget) and nobody had claimed the key since, so
-- it is this owner's claim again, marked taken over (a release then leaves it in
-- progress: the body may have acted), and the body goes on to store its result; 0 when
-- another call owns the key now or stored its result (the claim is lost).
local raw = redis.call('GET', KEYS[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not raw then
  local rec = {
    status = 'in_progress',
    owner = ARGV[1],
    fp = ARGV[4],
    lease_until_ms = now + tonumber(ARGV[2]),
    claimed_at_ms = now,
    retention_ms = tonumber(ARGV[3]) - tonumber(ARGV[2]),
    took_over = true,
  }
  redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[3])
  return 2
end
if string.find(raw, '{"status":"completed","fp":"', 1, true) then
  return 0
end
-- `owned`: idem_owned.lua.
if not owned(raw, ARGV[1]) then
  return 0
end
local renewed = string.gsub(raw, '"lease_until_ms":%d+', '"lease_until_ms":' .. (now + tonumber(ARGV[2])), 1)
redis.call('SET', KEYS[1], renewed, 'PX', ARGV[3])
return 1
