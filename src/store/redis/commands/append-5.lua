-- KEYS: session hash, stream, the session's lease, the stream's ledger, the
--       session's audience.
-- ARGV: streamId, maxEvents, maxBytes, ttlMs, end ('1'|'0'), channel, origin
--       replica, fence token ('' for none), expected lastSeq (-1 for none),
--       the epoch that expectation belongs to, the upstream session the
--       batch was read from ('' for none), the session id, the batch's last
--       upstream id ('' for none), its event count, then the batch packed as
--       one or more stream entries, three arguments each (a few arguments per entry, not
--       per event, so a batch of hundreds of events costs the client one
--       small write): the entry's event count, its layout, four decimal
--       numbers per event: flags (1 event type, 2 upstream id, 4 a frame
--       rather than data), then the byte lengths of its frame or data, event
--       type and upstream id; and the events' fields concatenated. A large
--       batch comes as several entries (see ENTRY_MAX_BYTES in
--       append.ts): a replay page reads whole entries. The arguments before
--       the batch's last upstream id are HEAD below.
-- Returns nil when the session is unknown, else
-- { epoch, previous lastSeq, ended, already applied (1|0) }.
--
-- Sequence bump, XADD with explicit ids, trim by count and bytes (never the
-- newest event), TTL refresh and PUBLISH in one atomic step. Events a batch
-- would trim right away are never written.
--
-- Fencing: with a token, the append is refused (error MCPGW_FENCED) when another
-- replica holds the lease. A lease that merely expired (nobody took it) does
-- not refuse: the writer still holds the only upstream GET, and its next
-- renewal takes the lease back.
-- Expected lastSeq (every stream has one writer, which knows where it left
-- it): lower in Redis means Redis lost acknowledged writes (restart from an
-- older snapshot, failover to a lagging replica): error MCPGW_ROLLED_BACK, nothing
-- written; exactly this batch further means the batch was already applied
-- (a command resent after a reconnect): nothing written again. An
-- expectation from another epoch means nothing: the session was reset or
-- started a new epoch since (another writer detected a loss first).
--- @include "stream-state"
--- @include "trim-for-batch"
--- @include "add-entry"
--- @include "fenced-off"
--- @include "notify-others"
--- @include "keep-upstream-id"
local meta, skey, lease, zkey, audience = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sid, maxEvents, maxBytes, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local ending, channel, origin = ARGV[5] == '1', ARGV[6], ARGV[7]
local fence, expected = ARGV[8], tonumber(ARGV[9])
local readFrom, sessionId = ARGV[11], ARGV[12]
local HEAD = 12
local upstreamId = ARGV[HEAD + 1] or ''
local n = tonumber(ARGV[HEAD + 2] or '0')
-- The entries: (count, layout, blob) from HEAD + 3 on.
local size, layouts = 0, {}
for i = HEAD + 3, #ARGV, 3 do
  size = size + #ARGV[i + 2]
  layouts[#layouts + 1] = ARGV[i + 1]
end

local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
if fencedOff(lease, fence) then return redis.error_reply('MCPGW_FENCED the stream lease is held by another replica') end
local last, first, bytes, ended = streamState(meta, skey, sid)
if ARGV[10] ~= epoch then expected = -1 end
if expected >= 0 then
  if (last == nil and expected > 0) or (last ~= nil and last < expected) then
    return redis.error_reply('MCPGW_ROLLED_BACK the stream is behind what was acknowledged')
  end
  if last ~= nil and n > 0 and last == expected + n then
    return { epoch, expected, ended and 1 or 0, 1 }
  end
end
if last == nil then
  -- First use of the stream in this epoch: a key left behind by an earlier
  -- life of the same session id (its hash was lost) must not collide.
  redis.call('DEL', skey)
  last, first, bytes, ended = 0, 1, 0, false
end

local newLast = last + n
local keep, total = trimForBatch(skey, zkey, last, first, bytes, n, size, table.concat(layouts), maxEvents, maxBytes)
local at = last + 1
for i = HEAD + 3, #ARGV, 3 do
  local count = tonumber(ARGV[i])
  if at + count - 1 >= keep then
    addEntry(skey, zkey, at .. '-' .. count, ARGV[i + 1], ARGV[i + 2], ttl)
  else
    -- Every event of this entry is trimmed already: it is not written.
    total = total - #ARGV[i + 2]
  end
  at = at + count
end

if ending then ended = true end
redis.call('HSET', meta, 'q:' .. sid, newLast, 'f:' .. sid, keep, 'b:' .. sid, total, 'e:' .. sid, ended and '1' or '0')
keepUpstreamId(meta, sid, upstreamId, readFrom, sessionId)
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', skey, ttl)
if n > 0 or ending then notifyOthers(audience, origin, channel, epoch, sid, newLast, ended) end
return { epoch, last, ended and 1 or 0, 0 }
