-- A writer's try: `lock_try` (acquire.lua, above) once no reader holds.
-- KEYS[1] the lock key; KEYS[2] the readers (see read_acquire.lua); KEYS[3] the
-- writer-waiting mark; KEYS[4] the readers that wait behind a writer (read_acquire.lua). ARGV[1..4] as acquire.lua; ARGV[5] how long the mark lasts, in
-- ms (0: this caller will not try again, so it sets none).
-- A writer refused (by readers, or by another writer) sets the mark, which keeps new
-- readers out until it takes the lock or stops trying (its tries renew the mark, at
-- least every 100 ms while it waits): a stream of readers never starves a writer. Taken,
-- the writer removes its mark and marks its own value `waiting`, so its release wakes
-- the readers its mark kept out. Readers that waited behind the previous writer go
-- first: while one of them is not in yet, the writer is refused without a mark of its
-- own.
-- Returns as acquire.lua; refused by readers, how long until the first reader's lease
-- ends (ms, at least 1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local function wait_mark()
  if tonumber(ARGV[5]) > 0 then
    redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[5])
  end
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[1] then
  wait_mark()
  return math.max(tonumber(first[2]) - now, 1)
end
-- No reader holds: a `readers` left at the key (a reader whose lease ended without a
-- release) goes.
if redis.call('GET', KEYS[1]) == 'readers' then
  redis.call('DEL', KEYS[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local waiting = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if waiting[1] then
  local held = redis.call('GET', KEYS[1])
  if held ~= ARGV[1] and held ~= ARGV[1] .. ' waiting' then
    return math.max(tonumber(waiting[2]) - now, 1)
  end
end
local taken = lock_try()
if taken ~= 0 then
  wait_mark()
elseif redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
  if string.sub(redis.call('GET', KEYS[1]), -8) ~= ' waiting' then
    redis.call('APPEND', KEYS[1], ' waiting')
  end
end
return taken
