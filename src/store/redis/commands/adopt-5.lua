-- KEYS: session hash, lease, attached marker, standalone stream, its ledger.
-- ARGV: epoch, principal, ttlMs, upstream session id ('' for none), endpoint
-- ('' for none), then, for a holder recovering the session whose upstream GET
-- is open, the lease's token ('' for none), its ttlMs and the stream id.
-- Returns the session's { epoch, principal, upstream session id, endpoint }
-- ('' for a field the record lacks): the record it has, or, when it has none,
-- a fresh one from ARGV (after clearing what a lost session left). A token
-- takes the lease with the record (the record's own principal's holder, and
-- only while the lease is free): a lease taken after the record, in another
-- call, would be free in between for a replica watching the session.
local function hold()
  if ARGV[6] == '' then return end
  if redis.call('SET', KEYS[2], ARGV[6], 'NX', 'PX', ARGV[7]) then
    redis.call('HSET', KEYS[1], 'h:' .. ARGV[8], '1')
  end
end
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal', 'up', 'ep')
if rec[1] then
  if rec[2] == ARGV[2] then hold() end
  return { rec[1], rec[2] or '', rec[3] or '', rec[4] or '' }
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'up', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'ep', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
hold()
return { ARGV[1], ARGV[2], ARGV[4], ARGV[5] }
