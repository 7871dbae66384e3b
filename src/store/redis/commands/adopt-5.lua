-- KEYS: session hash, lease, attached marker, standalone stream, its ledger.
-- ARGV: epoch, principal, ttlMs, upstream session id ('' for none), endpoint
-- ('' for none).
-- Returns the session's { epoch, principal, upstream session id, endpoint }
-- ('' for a field the record lacks): the record it has, or, when it has none,
-- a fresh one from ARGV (after clearing what a lost session left).
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal', 'up', 'ep')
if rec[1] then return { rec[1], rec[2] or '', rec[3] or '', rec[4] or '' } end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'up', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'ep', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return { ARGV[1], ARGV[2], ARGV[4], ARGV[5] }
