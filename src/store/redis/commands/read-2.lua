-- KEYS: session hash, stream. ARGV: streamId, afterSeq, limit, maxBytes.
-- Returns nil when the session or stream is unknown, else
-- { epoch, lastSeq, firstSeq, ended, entries }: the entry holding the first
-- event after afterSeq, then more until they hold `limit` events or about
-- `maxBytes` bytes (the caller cuts the page exactly). State and entries come
-- from the same instant, so they always agree.
--- @include "stream-state"
--- @include "read-rows"
local meta, skey, sid = KEYS[1], KEYS[2], ARGV[1]
local after, limit, maxBytes = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
local last, first, bytes, ended = streamState(meta, skey, sid)
if last == nil then return false end
local rows = {}
local from = math.max(after + 1, first)
if limit > 0 and from <= last then rows = readRows(skey, from, limit, maxBytes) end
return { epoch, last, first, ended and 1 or 0, rows }
