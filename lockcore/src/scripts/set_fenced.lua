-- Stores a value only under a fence at least as large as the highest one seen for it:
-- the storage half of fencing. KEYS[1] the value's key, KEYS[2] the highest fence seen
-- (beside it, in its hash slot); ARGV[1] the value, ARGV[2] the writer's fence (decimal,
-- no leading zeros), ARGV[3] the value's ttl in milliseconds ('0': none). Returns nil
-- when stored (the fence is then the highest seen), else the highest fence seen, which
-- refused it. Fences compare as decimal strings (by length, then text), exact beyond
-- Lua's 2^53. The record of the highest fence gets the value's lifetime: the same ttl,
-- or none when the value has none.
local seen = redis.call('GET', KEYS[2]) or '0'
local fence = ARGV[2]
if #fence < #seen or (#fence == #seen and fence < seen) then
  return seen
end
if ARGV[3] == '0' then
  redis.call('SET', KEYS[2], fence)
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
end
return false
