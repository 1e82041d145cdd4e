-- The fence counter alone, for a fence while a cluster slot migrates (the counter and
-- the lock key may be on the slot's two nodes): as fence.lua steps it, max(counter + 1,
-- the server's clock in microseconds), with its idle window. KEYS[1] the counter; ARGV[1]
-- the idle window in milliseconds. Returns the new fence.
local t = redis.call('TIME')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
local fence = redis.call('INCR', KEYS[1])
if fence < tonumber(now) then
  redis.call('SET', KEYS[1], now, 'PX', ARGV[1])
  return tonumber(now)
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return fence
