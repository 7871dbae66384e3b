-- KEYS: session hash, stream, its ledger. ARGV: streamId, seq, ttlMs.
-- Returns 0 (nothing saved) when the session or stream is unknown, else 1.
if redis.call('HEXISTS', KEYS[1], 'q:' .. ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
