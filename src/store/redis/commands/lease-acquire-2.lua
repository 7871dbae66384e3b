-- Lease scripts. KEYS always: lease, session hash (same hash tag). The
-- session hash's h:<stream> field tells the next holder whether the previous
-- one ended the upstream GET cleanly; u:<stream> is the upstream's last id.
--
-- Take the lease if free. KEYS: lease, session hash. ARGV: token, ttlMs, streamId.
-- Returns { -1 } when the session is unknown, { 0, ms the lease still lives }
-- when another replica holds it, else { 1, previous h ('1' = not ended
-- cleanly), upstream's last id }.
if redis.call('EXISTS', KEYS[2]) == 0 then return { -1 } end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return { 0, redis.call('PTTL', KEYS[1]) } end
local st = redis.call('HMGET', KEYS[2], 'h:' .. ARGV[3], 'u:' .. ARGV[3])
redis.call('HSET', KEYS[2], 'h:' .. ARGV[3], '1')
return { 1, st[1] or '0', st[2] or '' }
