-- KEYS: session hash, stream. ARGV: streamId, ttlMs.
-- Returns nil when the session is unknown, else { epoch, lastSeq, firstSeq, ended }.
--- @include "stream-state"
local meta, skey, sid, ttl = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
local last, first, bytes, ended = streamState(meta, skey, sid)
if last == nil then
  redis.call('DEL', skey)
  last, first, ended = 0, 1, false
  redis.call('HSET', meta, 'q:' .. sid, 0, 'f:' .. sid, 1, 'b:' .. sid, 0, 'e:' .. sid, '0')
end
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', skey, ttl)
return { epoch, last, first, ended and 1 or 0 }
