-- KEYS: session hash, lease, attached marker, standalone stream, its ledger,
-- deletion mark.
-- ARGV: epoch, principal, ttlMs, upstream session id ('' for none), endpoint
-- ('' for none), then, for a holder recovering the session whose upstream GET
-- is open, the lease's token ('' for none), its ttlMs and the stream id; then
-- '1' when the upstream confirmed the session already, '0' when a request's
-- answer is to settle it (settle-adoption-1).
-- Returns the session's { epoch, principal, upstream session id, endpoint }
-- ('' for a field the record lacks): the record it has, or, when it has none,
-- a fresh one from ARGV (after clearing what a lost session left); nil,
-- recording nothing, when it has none and the session was deleted. When the
-- record is the principal's, the adoption counts toward it: 'rc' once
-- confirmed, 'rp' adoptions waiting for their answer. A token takes the lease
-- with the record, if free: a lease taken after the record, in another call,
-- would be free in between for a replica watching the session.
local function count()
  if ARGV[9] == '1' then
    redis.call('HSET', KEYS[1], 'rc', '1')
  else
    redis.call('HINCRBY', KEYS[1], 'rp', 1)
  end
  if ARGV[6] ~= '' and redis.call('SET', KEYS[2], ARGV[6], 'NX', 'PX', ARGV[7]) then
    redis.call('HSET', KEYS[1], 'h:' .. ARGV[8], '1')
  end
end
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal', 'up', 'ep')
if rec[1] then
  if rec[2] == ARGV[2] then count() end
  return { rec[1], rec[2] or '', rec[3] or '', rec[4] or '' }
end
if redis.call('EXISTS', KEYS[6]) == 1 then return nil end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'up', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'ep', ARGV[5]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
count()
return { ARGV[1], ARGV[2], ARGV[4], ARGV[5] }
