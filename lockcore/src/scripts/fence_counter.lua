-- The fence counter alone, for a fence while a cluster slot migrates (the counter and
-- the lock key may be on the slot's two nodes): as fence.lua steps it, max(counter + 1,
-- the server's clock in microseconds), with its idle window. KEYS[1] the counter; ARGV[1]
-- the idle window in milliseconds. Returns the new fence.
-- `next_fence`: fence_next.lua.
return next_fence(KEYS[1], ARGV[1])
