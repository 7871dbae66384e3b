-- Renew held leases, any number in one call. KEYS: lease and session hash of
-- each, in pairs. ARGV: ttlMs, streamId, then one token per pair. Returns one
-- result per pair: -1 when the session is unknown, 0 when another replica
-- holds the lease, 1 when renewed, 2 when it had expired unclaimed and is
-- taken back. (On Cluster a call carries one pair: its keys share a slot.)
local out = {}
for i = 1, #KEYS, 2 do
  local lease, meta, token = KEYS[i], KEYS[i + 1], ARGV[2 + (i + 1) / 2]
  local result
  if redis.call('EXISTS', meta) == 0 then
    result = -1
  else
    local holder = redis.call('GET', lease)
    if holder == token then
      redis.call('PEXPIRE', lease, ARGV[1])
      result = 1
    elseif holder then
      result = 0
    else
      redis.call('SET', lease, token, 'PX', ARGV[1])
      redis.call('HSET', meta, 'h:' .. ARGV[2], '1')
      result = 2
    end
  end
  out[#out + 1] = result
end
return out
