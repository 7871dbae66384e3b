/**
 * Lua sources of the Redis event store. Each script touches the keys of ONE
 * session only, all declared in KEYS and sharing the `{<session>}` hash tag, so
 * it runs atomically in one slot (Redis Cluster compatible).
 *
 * Session hash (`<prefix>{<session>}:m`):
 *   epoch, principal        the session record
 *   q:<stream>              sequence number of the newest event (lastSeq)
 *   f:<stream>              sequence number of the oldest retained event
 *   b:<stream>              bytes retained (data + event type + upstream id)
 *   e:<stream>              '1' once the stream ended
 *   c:<stream>              the saved cursor
 *   u:<stream>              the upstream's own id of the newest event that had one
 *   h:<stream>              '1' while an upstream GET feeds the stream under a
 *                           lease, or when its last holder did not end it cleanly
 * Lease `<prefix>{<session>}:lease`: the token of the replica holding the
 * session's upstream GET (SET NX PX, renewed by compare-and-pexpire).
 * Attached marker `<prefix>{<session>}:att`: refreshed by replicas with a
 * client on the standalone stream that do not hold the lease; while it
 * lives the holder keeps the upstream GET open.
 * Audience `<prefix>{<session>}:aud`: a set of the replicas subscribed to the
 * session's channel (added once SUBSCRIBE took effect, refreshed, removed on
 * UNSUBSCRIBE; it expires if nobody refreshes it). An append PUBLISHes its
 * notice only when a replica other than the writer is in it: the writer's own
 * listeners get the events directly.
 * Stream `<prefix>{<session>}:b:<stream>` (":b:" since batches; the per-event
 * layout of earlier versions lived under ":s:"): one entry per appended batch,
 * id `<first seq>-<event count>`, fields s (bytes), l (layout: four decimal
 * numbers per event: flags 1 event type, 2 upstream id, 4 an upstream frame
 * rather than data; then the byte lengths of its frame or data, event type
 * and upstream id) and b (those fields concatenated). Redis does one XADD per
 * upstream read, whatever the number of events in it; the gateway packs and
 * unpacks. A large batch's entries are written by plain XADDs beside the
 * script rather than by it (APPEND_SPLIT), under `<prefix>{<session>}:aside`
 * for the span of their MULTI: no other command ever sees that key. The
 * session hash's f: is exact: a batch's events below it are hidden from
 * reads until the whole entry is trimmed.
 *
 * The session hash is refreshed by every call that refreshes a stream key, so
 * it always outlives them. A stream key can still expire on its own (idle
 * stream of a busy session); the scripts then report its history as gone
 * (firstSeq = lastSeq + 1) so a resume into it sees the gap.
 */

/**
 * lastSeq, firstSeq, bytes, ended of a stream, or nil when the session hash
 * has no record of it.
 */
const STREAM_STATE = `
local function streamState (meta, skey, sid)
  local st = redis.call('HMGET', meta, 'q:' .. sid, 'f:' .. sid, 'b:' .. sid, 'e:' .. sid)
  if not st[1] then return nil end
  local last, first, bytes = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if first <= last and redis.call('EXISTS', skey) == 0 then
    first = last + 1
    bytes = 0
  end
  return last, first, bytes, st[4] == '1'
end
`

/**
 * Retention before a batch of n events (blob of `size` bytes, layout as in
 * APPEND) is added after `last`: f: (keep) is exact per event; storage goes by
 * whole entries, deleted once all their events are below keep, or while the
 * stream is over the byte limit (never the entry being added). Returns keep
 * and the stream's bytes once the batch is in.
 */
const TRIM_FOR_BATCH = `
local function trimForBatch (skey, zkey, last, first, bytes, n, size, layout, maxEvents, maxBytes)
  local newLast = last + n
  local total = bytes + size
  local keep = first
  if n == 0 then return keep, total end
  if keep < newLast - maxEvents + 1 then keep = newLast - maxEvents + 1 end
  if keep <= first and total <= maxBytes then return keep, total end
  -- Oldest entries first, one at a time. Once the events before keep are gone and
  -- the bytes are within the limit, the next entry stays: it is not even read (a
  -- read copies its whole batch into the script). The ledger gives each entry's id
  -- and size without reading it; while it does not match the stream (one key lost
  -- or expired without the other), entries are read instead.
  local ledger = redis.call('LLEN', zkey) == redis.call('XLEN', skey)
  local cursor, nextFirst, dropped, exhausted = '-', nil, 0, false
  while not (nextFirst and nextFirst >= keep and total <= maxBytes) do
    local id, esize
    if ledger then
      local item = redis.call('LINDEX', zkey, dropped)
      if item then
        local space = string.find(item, ' ', 1, true)
        id, esize = string.sub(item, 1, space - 1), tonumber(string.sub(item, space + 1))
      end
    else
      local row = redis.call('XRANGE', skey, cursor, '+', 'COUNT', 1)[1]
      if row then id, esize = row[1], tonumber(row[2][2]) end
    end
    if not id then
      exhausted = true
      break
    end
    local dash = string.find(id, '-', 1, true)
    local elast = tonumber(string.sub(id, 1, dash - 1)) + tonumber(string.sub(id, dash + 1)) - 1
    if elast >= keep and total <= maxBytes then break end
    total = total - esize
    if keep <= elast then keep = elast + 1 end
    dropped = dropped + 1
    nextFirst = elast + 1
    cursor = '(' .. id
  end
  if dropped > 0 then
    if exhausted then
      redis.call('DEL', skey, zkey)
    else
      redis.call('XTRIM', skey, 'MINID', nextFirst .. '-0')
      if ledger then
        redis.call('LTRIM', zkey, dropped, -1)
      else
        -- Drop what the ledger holds of the entries gone, so that it matches again.
        while true do
          local item = redis.call('LINDEX', zkey, 0)
          if not item or tonumber(string.sub(item, 1, string.find(item, '-', 1, true) - 1)) >= nextFirst then break end
          redis.call('LPOP', zkey)
        end
      end
    end
  end
  if exhausted and total > maxBytes then
    -- The new batch alone is over the limit: hide its oldest events (the newest stays).
    local sizes, i, visible = {}, 0, total
    for _, a, b, c in string.gmatch(layout, '(%d+) (%d+) (%d+) (%d+)') do
      i = i + 1
      sizes[i] = tonumber(a) + tonumber(b) + tonumber(c)
    end
    for seq = last + 1, keep - 1 do visible = visible - sizes[seq - last] end
    while keep < newLast and visible > maxBytes do
      visible = visible - sizes[keep - last]
      keep = keep + 1
    end
  end
  return keep, total
end
`

/**
 * Whether an append carrying the lease token `fence` ('' for none) is
 * refused: another replica holds the lease. A lease that merely expired
 * (nobody took it) does not refuse (see APPEND).
 */
const FENCED_OFF = `
local function fencedOff (lease, fence)
  if fence == '' then return false end
  local holder = redis.call('GET', lease)
  return holder ~= false and holder ~= fence
end
`

/**
 * Writes one batch entry (id <first seq>-<count>: its size, layout and bytes)
 * and notes its id and size in the stream's ledger (a list, one item per
 * entry, oldest first), which trimForBatch reads instead of the entries
 * themselves. A ledger left from a stream that is gone is dropped first.
 */
const ADD_ENTRY = `
local function addEntry (skey, zkey, id, layout, blob, ttl)
  if redis.call('XLEN', skey) == 0 then redis.call('DEL', zkey) end
  redis.call('XADD', skey, id, 's', #blob, 'l', layout, 'b', blob)
  redis.call('RPUSH', zkey, id .. ' ' .. #blob)
  redis.call('PEXPIRE', zkey, ttl)
end
`

/** Number of leading ARGV entries of APPEND before the events. */
export const APPEND_HEAD = 10

/** Error reply prefixes of APPEND. */
export const FENCED = 'MCPGW_FENCED'
export const ROLLED_BACK = 'MCPGW_ROLLED_BACK'

/**
 * KEYS: session hash, stream, the session's lease, the stream's ledger, the
 *       session's audience.
 * ARGV: streamId, maxEvents, maxBytes, ttlMs, end ('1'|'0'), channel, origin
 *       replica, fence token ('' for none), expected lastSeq (-1 for none),
 *       the epoch that expectation belongs to, the batch's last upstream id
 *       ('' for none), its event count, then the batch packed as one or more
 *       stream entries, three arguments each (a few arguments per entry, not
 *       per event, so a batch of hundreds of events costs the client one
 *       small write): the entry's event count, its layout, four decimal
 *       numbers per event: flags (1 event type, 2 upstream id, 4 a frame
 *       rather than data), then the byte lengths of its frame or data, event
 *       type and upstream id; and the events' fields concatenated. A large
 *       batch comes as several entries (see ENTRY_MAX_BYTES in
 *       redis-store.ts): a replay page reads whole entries.
 * Returns nil when the session is unknown, else
 * { epoch, previous lastSeq, ended, already applied (1|0) }.
 *
 * Sequence bump, XADD with explicit ids, trim by count and bytes (never the
 * newest event), TTL refresh and PUBLISH in one atomic step. Events a batch
 * would trim right away are never written.
 *
 * Fencing: with a token, the append is refused (error FENCED) when another
 * replica holds the lease. A lease that merely expired (nobody took it) does
 * not refuse: the writer still holds the only upstream GET, and its next
 * renewal takes the lease back.
 * Expected lastSeq (every stream has one writer, which knows where it left
 * it): lower in Redis means Redis lost acknowledged writes (restart from an
 * older snapshot, failover to a lagging replica): error ROLLED_BACK, nothing
 * written; exactly this batch further means the batch was already applied
 * (a command resent after a reconnect): nothing written again. An
 * expectation from another epoch means nothing: the session was reset or
 * started a new epoch since (another writer detected a loss first).
 */
export const APPEND = STREAM_STATE + TRIM_FOR_BATCH + ADD_ENTRY + FENCED_OFF + `
local meta, skey, lease, zkey, audience = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local sid, maxEvents, maxBytes, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local ending, channel, origin = ARGV[5] == '1', ARGV[6], ARGV[7]
local fence, expected = ARGV[8], tonumber(ARGV[9])
local HEAD = ${APPEND_HEAD}
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
if fencedOff(lease, fence) then return redis.error_reply('${FENCED} the stream lease is held by another replica') end
local last, first, bytes, ended = streamState(meta, skey, sid)
if ARGV[10] ~= epoch then expected = -1 end
if expected >= 0 then
  if (last == nil and expected > 0) or (last ~= nil and last < expected) then
    return redis.error_reply('${ROLLED_BACK} the stream is behind what was acknowledged')
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
if upstreamId ~= '' then redis.call('HSET', meta, 'u:' .. sid, upstreamId) end
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', skey, ttl)
if n > 0 or ending then
  -- Only another replica needs the notice (the writer delivers its own).
  local listening = redis.call('SCARD', audience)
  if listening > 1 or (listening == 1 and redis.call('SISMEMBER', audience, origin) == 0) then
    redis.call('PUBLISH', channel, cjson.encode({ o = origin, p = epoch, s = sid, t = newLast, e = ended }))
  end
end
return { epoch, last, ended and 1 or 0, 0 }
`

/** Error reply prefix of APPEND_SPLIT: not the case it takes; the caller appends with APPEND. */
export const UNSPLIT = 'MCPGW_UNSPLIT'

/**
 * APPEND for a batch whose bytes do not pass through the script. Redis's Lua
 * hashes every byte of every string a script is given (not a sample, as
 * stock Lua 5.1 does): about 1.5 ns per byte on the project's machine, which
 * was most of Redis's CPU per appended event. The caller sends, in one
 * MULTI ... EXEC:
 *
 *   EVALSHA APPEND_SPLIT                 this script
 *   XADD <aside> NOMKSTREAM <id> s <size> l <layout> b <bytes>, per entry
 *   EVAL UNPARK                          the stream back under its name
 *
 * Only when the script accepts the batch, as its last step, does it move the
 * stream to <aside> (or make an empty one there). Refused, failed, or not run
 * at all (NOSCRIPT), there is no <aside>: the XADDs find no key and write
 * nothing (NOMKSTREAM), and UNPARK has nothing to move. The entry ids are the
 * caller's: it takes this path only when it knows where the stream ends (the
 * expected lastSeq of APPEND), and the script accepts only when Redis agrees,
 * exactly, and the batch is within the retention limits (no event of it
 * trimmed at once). Anything else is refused with UNSPLIT, and the caller
 * sends the batch through APPEND, which handles every case.
 *
 * KEYS: session hash, stream, lease, ledger, audience, aside.
 * ARGV: as APPEND up to the event count; then per entry its event count and
 *       size in bytes.
 * Returns as APPEND (never "already applied": that is refused with UNSPLIT).
 */
export const APPEND_SPLIT = STREAM_STATE + TRIM_FOR_BATCH + FENCED_OFF + `
local meta, skey, lease, zkey, audience, aside = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local sid, maxEvents, maxBytes, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local ending, channel, origin = ARGV[5] == '1', ARGV[6], ARGV[7]
local fence, expected = ARGV[8], tonumber(ARGV[9])
local HEAD = ${APPEND_HEAD}
local upstreamId = ARGV[HEAD + 1]
local n = tonumber(ARGV[HEAD + 2])
local size = 0
for i = HEAD + 3, #ARGV, 2 do size = size + tonumber(ARGV[i + 1]) end

local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
if fencedOff(lease, fence) then return redis.error_reply('${FENCED} the stream lease is held by another replica') end
local last, first, bytes, ended = streamState(meta, skey, sid)
if ARGV[10] ~= epoch or last ~= expected or n < 1 or n > maxEvents or size > maxBytes then
  return redis.error_reply('${UNSPLIT} not where the caller expects it')
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
if upstreamId ~= '' then redis.call('HSET', meta, 'u:' .. sid, upstreamId) end
redis.call('PEXPIRE', meta, ttl)
if n > 0 or ending then
  local listening = redis.call('SCARD', audience)
  if listening > 1 or (listening == 1 and redis.call('SISMEMBER', audience, origin) == 0) then
    redis.call('PUBLISH', channel, cjson.encode({ o = origin, p = epoch, s = sid, t = newLast, e = ended }))
  end
end
-- Last: the stream aside, for the XADDs that follow (UNPARK moves it back).
if redis.call('EXISTS', skey) == 0 then
  redis.call('XADD', skey, '0-1', 'x', '')
  redis.call('XDEL', skey, '0-1')
end
redis.call('PEXPIRE', skey, ttl)
redis.call('RENAME', skey, aside)
return { epoch, last, ended and 1 or 0, 0 }
`

/**
 * The last command of APPEND_SPLIT's transaction: the stream back from where
 * it was put aside, if it is (an accepted batch). Sent as EVAL, never
 * EVALSHA: a NOSCRIPT here would leave the stream aside. (A plain RENAME
 * fails when there is nothing to move back: an error reply, which ioredis
 * makes into an Error with its stack.)
 * KEYS: aside, the stream.
 */
export const UNPARK = `
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
return 1
`

/**
 * KEYS: audiences (one per session; keys of many sessions only where they
 * share a node, see RedisEventStore). ARGV: replica, ttlMs.
 * Adds the replica to each audience and refreshes its TTL. Returns, per key,
 * 1 when the replica was not in it (appends since may not have told it).
 */
export const JOIN = `
local added = {}
for i, key in ipairs(KEYS) do
  added[i] = redis.call('SADD', key, ARGV[1])
  redis.call('PEXPIRE', key, ARGV[2])
end
return added
`

/**
 * KEYS: session hash, stream. ARGV: streamId, ttlMs.
 * Returns nil when the session is unknown, else { epoch, lastSeq, firstSeq, ended }.
 */
export const OPEN = STREAM_STATE + `
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
`

/** Sequence numbers of a batch entry, from its id `<first seq>-<count>`. */
const ENTRY_SEQS = `
local function countOf (id)
  return tonumber(string.sub(id, string.find(id, '-', 1, true) + 1))
end
local function firstOf (id)
  return tonumber(string.sub(id, 1, string.find(id, '-', 1, true) - 1))
end
local function lastOf (id)
  return firstOf(id) + countOf(id) - 1
end
`

/**
 * The entries READ returns, read in the script: the one holding `from`,
 * then as many as `limit` events need, or about `maxBytes` bytes.
 */
const READ_ROWS = ENTRY_SEQS + `
local function readRows (skey, from, limit, maxBytes)
  local rows = {}
  local got, size, cursor = 0, 0, '-'
  local head = redis.call('XREVRANGE', skey, tostring(from), '-', 'COUNT', 1)
  if #head > 0 then
    rows[1] = head[1]
    got = math.max(0, lastOf(head[1][1]) - from + 1)
    -- Its bytes from \`from\` on, estimated by its share of the entry's events
    -- (reading its layout would cost more than the page): with events of
    -- uneven sizes a page may end here, at the entry's end, short of maxBytes.
    size = tonumber(head[1][2][2]) * got / countOf(head[1][1])
    cursor = '(' .. head[1][1]
  end
  while got < limit and size < maxBytes do
    local more = redis.call('XRANGE', skey, cursor, '+', 'COUNT', 4)
    for _, row in ipairs(more) do
      rows[#rows + 1] = row
      got = got + countOf(row[1])
      size = size + tonumber(row[2][2])
      cursor = '(' .. row[1]
      if got >= limit or size >= maxBytes then break end
    end
    if #more < 4 then break end
  end
  return rows
end
`

/**
 * KEYS: session hash, stream. ARGV: streamId, afterSeq, limit, maxBytes.
 * Returns nil when the session or stream is unknown, else
 * { epoch, lastSeq, firstSeq, ended, entries }: the entry holding the first
 * event after afterSeq, then more until they hold `limit` events or about
 * `maxBytes` bytes (the caller cuts the page exactly). State and entries come
 * from the same instant, so they always agree.
 */
export const READ = STREAM_STATE + READ_ROWS + `
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
`

/**
 * READ, for pages whose entries are large, without their bytes passing
 * through the script (each byte a script reads costs Redis a hash step, see
 * APPEND_SPLIT). The entries of the page are found in the stream's ledger
 * (ids and sizes, see ADD_ENTRY) by the same rule as READ. When they come to
 * at least `splitMin` bytes, the script returns their ids instead of them:
 * { epoch, lastSeq, firstSeq, ended, {}, first id, last id, entry count },
 * and the caller reads them with a plain XRANGE in a MULTI with HGET epoch,
 * so that it can tell they are still those (same epoch, same count, same
 * ends). Otherwise, or when the ledger does not match the stream, it
 * answers as READ.
 * KEYS: session hash, stream, ledger. ARGV: as READ, then splitMin.
 */
export const READ_PLAN = STREAM_STATE + READ_ROWS + `
local meta, skey, zkey, sid = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local after, limit, maxBytes, splitMin = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return false end
local last, first, bytes, ended = streamState(meta, skey, sid)
if last == nil then return false end
local from = math.max(after + 1, first)
if limit == 0 or from > last then return { epoch, last, first, ended and 1 or 0, {} } end
local n = redis.call('LLEN', zkey)
if n == 0 or n ~= redis.call('XLEN', skey) then
  return { epoch, last, first, ended and 1 or 0, readRows(skey, from, limit, maxBytes) }
end
local function item (i)
  local text = redis.call('LINDEX', zkey, i)
  local space = string.find(text, ' ', 1, true)
  return string.sub(text, 1, space - 1), tonumber(string.sub(text, space + 1))
end
-- The last entry that starts at or before \`from\` (entries are in order).
local lo, hi = 0, n - 1
while lo < hi do
  local mid = math.floor((lo + hi + 1) / 2)
  if firstOf((item(mid))) <= from then lo = mid else hi = mid - 1 end
end
local headId, headSize = item(lo)
if firstOf(headId) > from or lastOf(headId) < from then
  -- Not where the ledger says: READ's own way.
  return { epoch, last, first, ended and 1 or 0, readRows(skey, from, limit, maxBytes) }
end
local got = lastOf(headId) - from + 1
local size = headSize * got / countOf(headId)
local whole, count, lastId = headSize, 1, headId
local at = lo + 1
while got < limit and size < maxBytes and at < n do
  local id, esize = item(at)
  got = got + countOf(id)
  size = size + esize
  whole = whole + esize
  count = count + 1
  lastId = id
  at = at + 1
end
if whole >= splitMin then return { epoch, last, first, ended and 1 or 0, {}, headId, lastId, count } end
local rows = redis.call('XRANGE', skey, headId, lastId)
-- A ledger as long as the stream but naming other entries: READ's own way.
if #rows ~= count or rows[1][1] ~= headId then rows = readRows(skey, from, limit, maxBytes) end
return { epoch, last, first, ended and 1 or 0, rows }
`

/**
 * KEYS: session hash, standalone stream, its ledger. ARGV: ttlMs.
 * Returns nil when the session is unknown, else { epoch, principal }. The
 * standalone stream lives as long as the session, so it is refreshed with it;
 * request streams are refreshed by their own appends.
 */
export const TOUCH = `
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal')
if not rec[1] then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return { rec[1], rec[2] or '' }
`

/**
 * KEYS: session hash, lease, attached marker, standalone stream, its ledger.
 * ARGV: epoch, principal, ttlMs.
 * Returns the session's { epoch, principal }: the record it has, or, when it
 * has none, a fresh one from ARGV (after clearing what a lost session left).
 */
export const ADOPT = `
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal')
if rec[1] then return { rec[1], rec[2] or '' } end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return { ARGV[1], ARGV[2] }
`

/**
 * KEYS: the store's intact mark. ARGV: now (ms). The mark holds the time the
 * store was first found without it: set now if missing. Returns its value.
 */
export const INTACT = `
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
`

/**
 * KEYS: session hash, stream, its ledger. ARGV: streamId, seq, ttlMs.
 * Returns 0 (nothing saved) when the session or stream is unknown, else 1.
 */
export const SAVE_CURSOR = `
if redis.call('HEXISTS', KEYS[1], 'q:' .. ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
`

/**
 * KEYS: session hash, lease, attached marker, then the key of every stream
 * the caller found in the hash, then their ledgers.
 * ARGV: new epoch ('' to only delete), principal, ttlMs, then the ids of
 * those streams.
 * Deletes the session and, given an epoch, writes a fresh record. Returns 0
 * without touching anything when the hash lists other streams than the caller
 * passed (a stream was opened meanwhile): the caller reads them again and
 * retries, so every key stays declared in KEYS.
 */
export const RESET = `
local count, known = 0, {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 'q:' then
    known[string.sub(field, 3)] = true
    count = count + 1
  end
end
if count ~= #ARGV - 3 or #KEYS ~= 3 + 2 * count then return 0 end
for i = 4, #ARGV do
  if not known[ARGV[i]] then return 0 end
end
for i = 1, #KEYS, 500 do
  redis.call('DEL', unpack(KEYS, i, math.min(i + 499, #KEYS)))
end
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
`

/**
 * Lease scripts. KEYS always: lease, session hash (same hash tag). The
 * session hash's h:<stream> field tells the next holder whether the previous
 * one ended the upstream GET cleanly; u:<stream> is the upstream's last id.
 */

/**
 * Take the lease if free. KEYS: lease, session hash. ARGV: token, ttlMs, streamId.
 * Returns { -1 } when the session is unknown, { 0, ms the lease still lives }
 * when another replica holds it, else { 1, previous h ('1' = not ended
 * cleanly), upstream's last id }.
 */
export const LEASE_ACQUIRE = `
if redis.call('EXISTS', KEYS[2]) == 0 then return { -1 } end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return { 0, redis.call('PTTL', KEYS[1]) } end
local st = redis.call('HMGET', KEYS[2], 'h:' .. ARGV[3], 'u:' .. ARGV[3])
redis.call('HSET', KEYS[2], 'h:' .. ARGV[3], '1')
return { 1, st[1] or '0', st[2] or '' }
`

/**
 * Renew held leases, any number in one call. KEYS: lease and session hash of
 * each, in pairs. ARGV: ttlMs, streamId, then one token per pair. Returns one
 * result per pair: -1 when the session is unknown, 0 when another replica
 * holds the lease, 1 when renewed, 2 when it had expired unclaimed and is
 * taken back. (On Cluster a call carries one pair: its keys share a slot.)
 */
export const LEASE_RENEW = `
local out = {}
for i = 1, #KEYS, 2 do
  local lease, meta, token = KEYS[i], KEYS[i + 1], ARGV[2 + (i + 1) / 2]
  local result
  if redis.call('EXISTS', meta) == 0 then
    result = -1
  else
    local holder = redis.call('GET', lease)
    if holder == token then
      redis.call('PEXPIRE', lease, ARGV[1])
      result = 1
    elseif holder then
      result = 0
    else
      redis.call('SET', lease, token, 'PX', ARGV[1])
      redis.call('HSET', meta, 'h:' .. ARGV[2], '1')
      result = 2
    end
  end
  out[#out + 1] = result
end
return out
`

/**
 * Release a held lease and tell the session's channel. KEYS: lease, session
 * hash. ARGV: token, live ('1' when the stream did not end cleanly), streamId,
 * channel, message. Returns 1 when released, 0 when not held under the token.
 */
export const LEASE_RELEASE = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'h:' .. ARGV[3], ARGV[2]) end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
`

/**
 * Release when no client is attached anywhere (the hold expired). KEYS:
 * lease, session hash, attached marker. ARGV: token, streamId, channel,
 * message. Returns -1 when not held under the token, 0 when released, else
 * the milliseconds the attached marker still lives (ask again then).
 */
export const LEASE_RELEASE_IF_IDLE = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local wait = redis.call('PTTL', KEYS[3])
if wait == -1 then wait = 1000 end
if wait > 0 then return wait end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'h:' .. ARGV[2], '0') end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 0
`

/**
 * Request stream recorders (cluster/lease.ts, RecorderLiveness). The session
 * hash's w:<stream> field names the replica recording a request stream; each
 * replica keeps a liveness key `<prefix>r:<replicaId>:alive` (PX LEASE_TTL_MS,
 * refreshed in every lease tick). That key is not the session's: a script
 * cannot read it on Cluster, so a replica reads it first (GET) and the script
 * below checks what it can in one slot: the stream is still unended and still
 * recorded by that replica. Replica ids are never reused (random per process),
 * so a recorder found dead stays dead.
 */

/**
 * KEYS: session hash. ARGV: streamId, replicaId.
 * Returns 0 when the session is unknown, else 1.
 */
export const CLAIM_RECORDER = `
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'w:' .. ARGV[1], ARGV[2])
return 1
`

/**
 * KEYS: session hash, stream, its ledger. ARGV: streamId, recorder replica, maxEvents,
 * maxBytes, ttlMs, channel, origin replica, data, event type ('' for none).
 * Returns nil when the session is unknown, 0 when there is nothing to do (the
 * stream ended, or another replica records it), else { epoch, lastSeq }.
 *
 * Appends one text event as a batch of one, in APPEND's entry format and with
 * its retention (TRIM_FOR_BATCH), marks the stream ended and PUBLISHes the
 * usual notice. Idempotent: a second caller finds the stream ended.
 */
export const END_ORPHANED = STREAM_STATE + TRIM_FOR_BATCH + ADD_ENTRY + `
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
local layout = (etype ~= '' and 1 or 0) .. ' ' .. #data .. ' ' .. #etype .. ' 0 '
local newLast = last + 1
local keep, total = trimForBatch(skey, zkey, last, first, bytes, 1, #blob, layout, maxEvents, maxBytes)
addEntry(skey, zkey, newLast .. '-1', layout, blob, ttl)
redis.call('HSET', meta, 'q:' .. sid, newLast, 'f:' .. sid, keep, 'b:' .. sid, total, 'e:' .. sid, '1')
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', skey, ttl)
redis.call('PUBLISH', channel, cjson.encode({ o = origin, p = epoch, s = sid, t = newLast, e = true }))
return { epoch, newLast }
`
