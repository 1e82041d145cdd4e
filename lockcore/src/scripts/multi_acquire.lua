-- Takes every lock of a multi-lock at once, or none. KEYS the lock keys (on one server,
-- or in one slot of a cluster); ARGV[1] the ttl in ms, ARGV[1 + i] the token for KEYS[i].
-- Returns 1 when every key was free and is taken now; 0 when one holds something (a
-- holder's token, a yield marker): nothing is written, and the caller takes the keys
-- one by one in order instead (acquire.lua).
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    return 0
  end
end
for i, key in ipairs(KEYS) do
  redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
end
return 1
