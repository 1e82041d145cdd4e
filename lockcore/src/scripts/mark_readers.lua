-- A read lock's `readers` kept alone, when its share's renewal ran without it (a cluster
-- slot migrating with the readers and the lock key on the slot's two nodes): made or
-- lengthened, never shortened, never written over a writer's token.
-- KEYS[1] the lock key; ARGV[1] how long the share now lasts, in ms.
local mark = redis.pcall('GET', KEYS[1])
if type(mark) == 'table' then
  return 0
end
if not mark then
  redis.call('SET', KEYS[1], 'readers', 'PX', ARGV[1])
elseif mark == 'readers' and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 1
