-- The notice of an append (its stream now ends at toSeq), PUBLISHed only
-- when a replica other than the writer (origin) is in the session's audience:
-- the writer delivers its own. The fields keep their one-letter names: the
-- replicas of a rolling upgrade read each other's notices.
local function notifyOthers (audience, origin, channel, epoch, sid, toSeq, ended)
  local listening = redis.call('SCARD', audience)
  if listening > 1 or (listening == 1 and redis.call('SISMEMBER', audience, origin) == 0) then
    redis.call('PUBLISH', channel, cjson.encode({ o = origin, p = epoch, s = sid, t = toSeq, e = ended }))
  end
end
