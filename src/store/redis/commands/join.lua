-- KEYS: audiences (one per session; keys of many sessions only where they
-- share a node, see RedisEventStore). ARGV: replica, ttlMs.
-- Adds the replica to each audience and refreshes its TTL. Returns, per key,
-- 1 when the replica was not in it (appends since may not have told it).
local added = {}
for i, key in ipairs(KEYS) do
  added[i] = redis.call('SADD', key, ARGV[1])
  redis.call('PEXPIRE', key, ARGV[2])
end
return added
