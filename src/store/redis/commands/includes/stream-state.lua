-- lastSeq, firstSeq, bytes, ended of a stream, or nil when the session hash
-- has no record of it.
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
