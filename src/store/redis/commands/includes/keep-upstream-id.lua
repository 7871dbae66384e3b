-- Keeps `upstreamId`, the last upstream event id of a batch of stream `sid`,
-- for a later holder of the stream's upstream GET to resume it from
-- (lease-acquire-2). `readFrom` is the upstream session the batch was read
-- from ('' when the writer does not say): once the session's record places
-- it elsewhere (move-placement-1), the id belongs to no stream of the new
-- upstream session, and an append still in flight from the old one must not
-- write it back. A record without `up` is placed on its own id, `sessionId`.
local function keepUpstreamId (meta, sid, upstreamId, readFrom, sessionId)
  if upstreamId == '' then return end
  if readFrom ~= '' and readFrom ~= (redis.call('HGET', meta, 'up') or sessionId) then return end
  redis.call('HSET', meta, 'u:' .. sid, upstreamId)
end
