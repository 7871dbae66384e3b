-- Release a held lease and tell the session's channel. KEYS: lease, session
-- hash. ARGV: token, live ('1' when the stream did not end cleanly), streamId,
-- channel, message. Returns 1 when released, 0 when not held under the token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('HSET', KEYS[2], 'h:' .. ARGV[3], ARGV[2]) end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
