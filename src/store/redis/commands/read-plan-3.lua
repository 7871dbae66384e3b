-- READ, for pages whose entries are large, without their bytes passing
-- through the script (each byte a script reads costs Redis a hash step, see
-- append-split-6). The entries of the page are found in the stream's ledger
-- (ids and sizes, see addEntry) by the same rule as READ. When they come to
-- at least `splitMin` bytes, the script returns their ids instead of them:
-- { epoch, lastSeq, firstSeq, ended, {}, first id, last id, entry count },
-- and the caller reads them with a plain XRANGE in a MULTI with HGET epoch,
-- so that it can tell they are still those (same epoch, same count, same
-- ends). Otherwise, or when the ledger does not match the stream, it
-- answers as READ.
-- KEYS: session hash, stream, ledger. ARGV: as READ, then splitMin.
--- @include "stream-state"
--- @include "read-rows"
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
-- The last entry that starts at or before `from` (entries are in order).
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
