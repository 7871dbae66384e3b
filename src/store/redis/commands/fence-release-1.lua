-- KEYS: a session's re-establishment fence. ARGV: the token it was taken with.
-- Deletes the fence only if it is still held under that token (one that ran
-- out and was taken by another replica stays theirs). Returns 1 when deleted.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
