-- KEYS: session hash, standalone stream, its ledger. ARGV: ttlMs.
-- Returns nil when the session is unknown, else { epoch, principal,
-- upstream session id ('' when the record has none), endpoint ('' none) }.
-- The standalone stream lives as long as the session, so it is refreshed
-- with it; request streams are refreshed by their own appends.
local rec = redis.call('HMGET', KEYS[1], 'epoch', 'principal', 'up', 'ep')
if not rec[1] then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[1])
return { rec[1], rec[2] or '', rec[3] or '', rec[4] or '' }
