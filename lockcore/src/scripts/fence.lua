-- A fence in one script, for a Redis Cluster: there the pipeline of `INCR` and `GET`
-- could find its two keys on two nodes while their slot migrates; a script runs on one
-- node with both keys or is told to try again.
-- KEYS[1] lock key, KEYS[2] its fence counter; ARGV[1] token.
-- Returns the next fence while the key holds the token (a waiter's mark included), else
-- nil: the lock is lost.
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] or held == ARGV[1] .. ' waiting' then
  return redis.call('INCR', KEYS[2])
end
return false
