-- Release when no client is attached anywhere (the hold expired). KEYS:
-- lease, session hash, attached marker. ARGV: token, streamId, channel,
-- message. Returns -1 when not held under the token, 0 when released, else
-- the milliseconds the attached marker still lives (ask again then).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local wait = redis.call('PTTL', KEYS[3])
if wait == -1 then wait = 1000 end
if wait > 0 then return wait end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'h:' .. ARGV[2], '0') end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 0
