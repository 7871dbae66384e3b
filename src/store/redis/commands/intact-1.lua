-- KEYS: the store's intact mark. ARGV: now (ms). The mark holds the time the
-- store was first found without it: set now if missing. Returns its value.
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
