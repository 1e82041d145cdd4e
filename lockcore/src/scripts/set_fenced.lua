-- Stores a value only under a fence at least as large as the highest one seen for it:
-- the storage half of fencing. KEYS[1] the value's key, KEYS[2] the highest fence seen
-- (beside it, in its hash slot); ARGV[1] the value, ARGV[2] the writer's fence (decimal,
-- no leading zeros). Returns nil when stored (the fence is then the highest seen), else
-- the highest fence seen, which refused it. Fences compare as decimal strings (by
-- length, then text), exact beyond Lua's 2^53.
local seen = redis.call('GET', KEYS[2]) or '0'
local fence = ARGV[2]
if #fence < #seen or (#fence == #seen and fence < seen) then
  return seen
end
if fence ~= seen then
  redis.call('SET', KEYS[2], fence)
end
redis.call('SET', KEYS[1], ARGV[1])
return false
