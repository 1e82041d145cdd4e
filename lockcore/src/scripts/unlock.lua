-- The uncontended release: compare-and-delete unless someone waits for a message.
-- KEYS[1] lock key, KEYS[2] its waiting marker (same slot); ARGV[1] token.
-- Returns 1 released, 0 lost (the key is gone or holds another token), 2 still held:
-- waiters are registered, so the caller runs `release.lua` to wake them or yield.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
