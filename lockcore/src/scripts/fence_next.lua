-- Prepended to fence.lua and fence_counter.lua when loaded: the one rule of a fence.
-- The next fence of `counter`: max(counter + 1, the server's clock in microseconds since
-- the epoch), the counter left expiring after `idle` milliseconds without a fence.
local function next_fence(counter, idle)
  local t = redis.call('TIME')
  local now = t[1] .. string.format('%06d', tonumber(t[2]))
  local fence = redis.call('INCR', counter)
  if fence < tonumber(now) then
    redis.call('SET', counter, now, 'PX', idle)
    return tonumber(now)
  end
  redis.call('PEXPIRE', counter, idle)
  return fence
end
