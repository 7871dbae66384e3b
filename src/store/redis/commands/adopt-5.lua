-- KEYS: session hash, lease, attached marker, standalone stream, its ledger.
-- ARGV: epoch, principal, ttlMs.
-- Returns the session's { epoch, principal }: the record it has, or, when it
-- has none, a fresh one from ARGV (after clearing what a lost session left).
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal')
if rec[1] then return { rec[1], rec[2] or '' } end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return { ARGV[1], ARGV[2] }
