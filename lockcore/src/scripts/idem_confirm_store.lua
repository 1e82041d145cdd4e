-- A stored result made sure of before `WAIT` counts it (pipelined with the `WAIT`, on
-- one connection: see backend/replicas.rs). A failover between the store and the `WAIT`
-- leaves the result on the old primary only; found missing here, on the primary the
-- `WAIT` is sent to, it is written again, so the replicas that acknowledge the `WAIT`
-- hold it.
-- KEYS[1] record key. ARGV[1] the completed record, ARGV[2] the owner's token, ARGV[3] the
-- retention in ms (the key's ttl when it has to be written alone), ARGV[4] the channel
-- that wakes waiters.
-- Returns 1 when ARGV[1] is the stored result, 2 when it was written again now (after this
-- owner's claim, or alone where the key had gone), 0 when another call's result or claim
-- is there (this result is not stored).
-- `owned`: idem_owned.lua. Read with pcall: a key of another kind is not this record.
local raw = redis.pcall('GET', KEYS[1])
if type(raw) == 'table' and raw.err then
  return 0
end
if not raw then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[4], '1')
  return 2
end
local done = string.find(raw, '{"status":"completed","fp":"', 1, true)
if done then
  if string.sub(raw, done, done + #ARGV[1] - 1) == ARGV[1] then
    -- There: its expiry written again, the same, so that the `WAIT` behind has a write
    -- of this connection's to count (it counts none from a script that only read).
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then
      redis.call('PEXPIRE', KEYS[1], left)
    end
    return 1
  end
  return 0
end
if owned(raw, ARGV[2]) then
  redis.call('APPEND', KEYS[1], ARGV[1])
  redis.call('PUBLISH', ARGV[4], '1')
  return 2
end
return 0
