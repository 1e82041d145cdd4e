-- What holds a lock, a semaphore or a read/write lock, in one atomic look (read only).
-- KEYS[1] the key, KEYS[2] its fence counter, KEYS[3] its readers, KEYS[4] a waiting
-- writer's mark; ARGV[1] the channel that wakes its waiters.
-- Returns {type of the key, its value (a string key's) or false, its pttl in ms, the
-- last fence or false, the holders of a sorted set at the key (token, lease end, ...),
-- the readers (token, lease end, ...), the waiting writer's token or false, how many
-- clients listen on the channel, the server's time in ms}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1])['ok']
local value = false
local holders = {}
if kind == 'string' then
  value = redis.call('GET', KEYS[1])
elseif kind == 'zset' then
  holders = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
end
local readers = {}
if redis.call('TYPE', KEYS[3])['ok'] == 'zset' then
  readers = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
end
local fence = false
if redis.call('TYPE', KEYS[2])['ok'] == 'string' then
  fence = redis.call('GET', KEYS[2])
end
local writer = false
if redis.call('TYPE', KEYS[4])['ok'] == 'string' then
  writer = redis.call('GET', KEYS[4])
end
return {kind, value, redis.call('PTTL', KEYS[1]), fence, holders, readers, writer,
  redis.call('PUBSUB', 'NUMSUB', ARGV[1])[2], now}
