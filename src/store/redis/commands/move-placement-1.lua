-- KEYS: session hash. ARGV: session id, expected upstream session id, new
-- upstream session id, new endpoint ('' for none), the standalone stream's id.
-- Compare and set: the placement changes only if the record's upstream id
-- (the session id when it has none) is still the expected one. The upstream
-- event id the standalone stream last recorded (u:<id>) goes with the old
-- upstream session: a new one never issued it, and the next holder must not
-- resume its GET from it. A move that keeps the upstream session id (the
-- record comes to name the endpoint holding it) keeps it: the same stream
-- resumes from there. Returns nil when the session is unknown, else the
-- record after the call, as touch-3.
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal', 'up', 'ep')
if not rec[1] then return false end
if (rec[3] or ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], 'up', ARGV[3])
  if ARGV[3] ~= ARGV[2] then redis.call('HDEL', KEYS[1], 'u:' .. ARGV[5]) end
  if ARGV[4] == '' then redis.call('HDEL', KEYS[1], 'ep') else redis.call('HSET', KEYS[1], 'ep', ARGV[4]) end
  return { rec[1], rec[2] or '', ARGV[3], ARGV[4] }
end
return { rec[1], rec[2] or '', rec[3] or '', rec[4] or '' }
