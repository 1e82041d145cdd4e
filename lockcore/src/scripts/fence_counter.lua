-- The fence counter alone, for a fence while a cluster slot migrates (the counter and
-- the lock key may be on the slot's two nodes): seeded as fence.lua seeds it, then
-- incremented. KEYS[1] the counter. Returns its new value.
if redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[1], t[1] .. string.format('%06d', tonumber(t[2])))
end
return redis.call('INCR', KEYS[1])
