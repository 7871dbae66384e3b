-- KEYS: session hash, stream, its ledger. ARGV: streamId, recorder replica, maxEvents,
-- maxBytes, ttlMs, channel, origin replica, data, event type ('' for none).
-- Returns nil when the session is unknown, 0 when there is nothing to do (the
-- stream ended, or another replica records it), else { epoch, lastSeq }.
--
-- Appends one text event as a batch of one, in append-5's entry format and with
-- its retention (trimForBatch), marks the stream ended and PUBLISHes the
-- usual notice. Idempotent: a second caller finds the stream ended.
--- @include "stream-state"
--- @include "trim-for-batch"
--- @include "add-entry"
local meta, skey, zkey = KEYS[1], KEYS[2], KEYS[3]
local sid, recorder = ARGV[1], ARGV[2]
local maxEvents, maxBytes, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local channel, origin, data, etype = ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
if redis.call('HGET', meta, 'w:' .. sid) ~= recorder then return 0 end
local last, first, bytes, ended = streamState(meta, skey, sid)
if last == nil or ended then return 0 end

local blob = data .. etype
-- One text event in the packed layout's text form (src/store/batch/packed-layout.ts).
local layout = (etype ~= '' and 1 or 0) .. ' ' .. #data .. ' ' .. #etype .. ' 0 '
local newLast = last + 1
local keep, total = trimForBatch(skey, zkey, last, first, bytes, 1, #blob, layout, maxEvents, maxBytes)
addEntry(skey, zkey, newLast .. '-1', layout, blob, ttl)
redis.call('HSET', meta, 'q:' .. sid, newLast, 'f:' .. sid, keep, 'b:' .. sid, total, 'e:' .. sid, '1')
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', skey, ttl)
redis.call('PUBLISH', channel, cjson.encode({ o = origin, p = epoch, s = sid, t = newLast, e = true }))
return { epoch, newLast }
