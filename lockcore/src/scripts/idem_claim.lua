-- Claim an idempotency record in one step, on the contended path: the client's plain
-- `SET key record NX GET PX lifetime` found a record that is not completed (or the key
-- expired since). KEYS[1] record key.
-- ARGV[1] owner token, ARGV[2] payload fingerprint, ARGV[3] lease in ms,
-- ARGV[4] lifetime of the in-progress key in ms (lease + retention, so nothing is stuck forever),
-- ARGV[5] '1' when the caller waits for a call in progress: the record is marked
-- (`waited`), so its complete or release publishes on its channel (only then).
-- Returns {code, detail}:
--   1 claimed (detail '')
--   2 claimed by taking over an in-progress record whose lease had ended (detail: its owner)
--   3 completed earlier with the same fingerprint (detail: the completed record, to
--     replay, and whatever was appended after it)
--   4 in progress under a live lease (detail: ms left on that lease)
--   5 same key, different fingerprint, whether completed, in progress or expired in
--     progress (detail: the record's status)
-- The lease is the key's own ttl minus the retention the record was written with
-- (`retention_ms`; lifetime = lease + retention, set by every claim and renewal): Redis's
-- clock, never the caller's, and never the caller's settings. A record written without
-- `retention_ms` (by an earlier version) is judged by `lease_until_ms` against TIME.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- `took_over`: a claim that ran before this one may have run its body, so the record
-- must not go away when this claim is released (see idem_release.lua).
local function claim(took_over, waited)
  local now = now_ms()
  local rec = {
    status = 'in_progress',
    owner = ARGV[1],
    fp = ARGV[2],
    lease_until_ms = now + tonumber(ARGV[3]),
    claimed_at_ms = now,
    retention_ms = tonumber(ARGV[4]) - tonumber(ARGV[3]),
  }
  if took_over then
    rec.took_over = true
  end
  if waited then
    rec.waited = true
  end
  redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', ARGV[4])
end
local raw = redis.call('GET', KEYS[1])
if not raw then
  claim()
  return {1, ''}
end
-- A completed record is appended to the claim's record (see idem_settle.lua), or stands
-- alone when the key had gone; written with `status` and `fp` first, so it is found and
-- read without decoding a body that may be large. The first one is the stored result.
local status, fp = nil, nil
local done = string.find(raw, '{"status":"completed","fp":"', 1, true)
if done then
  status = 'completed'
  fp = string.match(raw, '^{"status":"completed","fp":"(%x*)"', done)
end
local rec = nil
if status ~= 'completed' then
  local ok, decoded = pcall(cjson.decode, raw)
  if not ok or type(decoded) ~= 'table' then
    return redis.error_reply('ERR idempotency record ' .. KEYS[1] .. ' is not a JSON object')
  end
  rec = decoded
  status = rec.status
  fp = rec.fp
end
if status == 'completed' then
  if fp ~= ARGV[2] then
    return {5, 'completed'}
  end
  return {3, string.sub(raw, done)}
end
if status ~= 'in_progress' then
  return redis.error_reply('ERR idempotency record ' .. KEYS[1] .. ' has unknown status')
end
if rec.owner == ARGV[1] then
  -- A retry of this same claim whose first reply was lost.
  claim(rec.took_over, rec.waited)
  return {1, ''}
end
-- Another payload never runs under this key, not even once the lease has ended: the
-- claimer that stopped may already have acted on its own payload.
if fp ~= ARGV[2] then
  return {5, 'in_progress'}
end
local left
if rec.retention_ms then
  left = redis.call('PTTL', KEYS[1]) - tonumber(rec.retention_ms)
else
  left = (tonumber(rec.lease_until_ms) or 0) - now_ms()
end
if left > 0 then
  if ARGV[5] == '1' and not rec.waited then
    rec.waited = true
    redis.call('SET', KEYS[1], cjson.encode(rec), 'KEEPTTL')
  end
  return {4, tostring(left)}
end
-- The claimer stopped renewing (crashed, or paused past its lease), or gave up a claim
-- that had itself taken over: take it over.
claim(true, rec.waited)
return {2, tostring(rec.owner)}
