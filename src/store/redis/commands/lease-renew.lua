-- Renew held leases, any number in one call. KEYS: lease and session hash of
-- each, in pairs. ARGV: ttlMs, streamId, then per pair its token and the
-- upstream session id its holder reads ('' when it does not say). Returns one
-- result per pair: -1 when the session is unknown, 0 when another replica
-- holds the lease, 1 when renewed, 2 when it had expired unclaimed and is
-- taken back, 3 when renewed or taken back but the record's upstream id is
-- another (the session was established upstream again, maybe by another
-- replica). A record without one was never moved. Only the upstream session
-- id is compared, not the endpoint (samePlacement in TypeScript compares
-- both): a re-establishment always gives the session a new upstream id, and
-- a record that comes to name the endpoint already holding its session
-- moves no GET. (On Cluster a call carries one pair: its keys share a slot.)
local out = {}
for i = 1, #KEYS, 2 do
  local lease, meta = KEYS[i], KEYS[i + 1]
  local token, reading = ARGV[2 + i], ARGV[3 + i]
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
    if result > 0 and reading ~= '' then
      local up = redis.call('HGET', meta, 'up')
      if up and up ~= reading then result = 3 end
    end
  end
  out[#out + 1] = result
end
return out
