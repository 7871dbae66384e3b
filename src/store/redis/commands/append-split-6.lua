-- APPEND for a batch whose bytes do not pass through the script. Redis's Lua
-- hashes every byte of every string a script is given (not a sample, as
-- stock Lua 5.1 does): about 1.5 ns per byte on the project's machine, which
-- was most of Redis's CPU per appended event. The caller sends, in one
-- MULTI ... EXEC:
--
--   EVALSHA append-split-6               this script
--   XADD <aside> NOMKSTREAM <id> s <size> l <layout> b <bytes>, per entry
--   EVAL unpark-2                        the stream back under its name
--
-- Only when the script accepts the batch, as its last step, does it move the
-- stream to <aside> (or make an empty one there). Refused, failed, or not run
-- at all (NOSCRIPT), there is no <aside>: the XADDs find no key and write
-- nothing (NOMKSTREAM), and unpark-2 has nothing to move. The entry ids are the
-- caller's: it takes this path only when it knows where the stream ends (the
-- expected lastSeq of APPEND), and the script accepts only when Redis agrees,
-- exactly, and the batch is within the retention limits (no event of it
-- trimmed at once). Anything else is refused with MCPGW_UNSPLIT, and the caller
-- sends the batch through APPEND, which handles every case.
--
-- KEYS: session hash, stream, lease, ledger, audience, aside.
-- ARGV: as APPEND up to the event count; then per entry its event count and
--       size in bytes.
-- Returns as APPEND (never "already applied": that is refused with MCPGW_UNSPLIT).
--- @include "stream-state"
--- @include "trim-for-batch"
--- @include "fenced-off"
--- @include "notify-others"
--- @include "keep-upstream-id"
local meta, skey, lease, zkey, audience, aside = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local sid, maxEvents, maxBytes, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local ending, channel, origin = ARGV[5] == '1', ARGV[6], ARGV[7]
local fence, expected = ARGV[8], tonumber(ARGV[9])
local readFrom, sessionId = ARGV[11], ARGV[12]
local HEAD = 12
local upstreamId = ARGV[HEAD + 1]
local n = tonumber(ARGV[HEAD + 2])
local size = 0
for i = HEAD + 3, #ARGV, 2 do size = size + tonumber(ARGV[i + 1]) end

local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
if fencedOff(lease, fence) then return redis.error_reply('MCPGW_FENCED the stream lease is held by another replica') end
local last, first, bytes, ended = streamState(meta, skey, sid)
if ARGV[10] ~= epoch or last ~= expected or n < 1 or n > maxEvents or size > maxBytes then
  return redis.error_reply('MCPGW_UNSPLIT not where the caller expects it')
end

local newLast = last + n
local keep, total = trimForBatch(skey, zkey, last, first, bytes, n, size, '', maxEvents, maxBytes)
if redis.call('XLEN', skey) == 0 then redis.call('DEL', zkey) end
local at = last + 1
for i = HEAD + 3, #ARGV, 2 do
  redis.call('RPUSH', zkey, at .. '-' .. ARGV[i] .. ' ' .. ARGV[i + 1])
  at = at + tonumber(ARGV[i])
end
redis.call('PEXPIRE', zkey, ttl)

if ending then ended = true end
redis.call('HSET', meta, 'q:' .. sid, newLast, 'f:' .. sid, keep, 'b:' .. sid, total, 'e:' .. sid, ended and '1' or '0')
keepUpstreamId(meta, sid, upstreamId, readFrom, sessionId)
redis.call('PEXPIRE', meta, ttl)
if n > 0 or ending then notifyOthers(audience, origin, channel, epoch, sid, newLast, ended) end
-- Last: the stream aside, for the XADDs that follow (unpark-2 moves it back).
if redis.call('EXISTS', skey) == 0 then
  redis.call('XADD', skey, '0-1', 'x', '')
  redis.call('XDEL', skey, '0-1')
end
redis.call('PEXPIRE', skey, ttl)
redis.call('RENAME', skey, aside)
return { epoch, last, ended and 1 or 0, 0 }
