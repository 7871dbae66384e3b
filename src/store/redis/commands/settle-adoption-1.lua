-- KEYS: session hash. ARGV: epoch, '1' when the upstream confirmed the
-- adoption, '0' when it refused it.
-- Settles one pending adoption of the session in that epoch (adopt-6):
-- returns 1 when the record is to be dropped (refused, no adoption of the
-- epoch confirmed, none still pending), else 0. Nothing is done when the
-- record is gone or in another epoch, and nothing dropped for a settlement
-- no adoption counted.
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local pending = redis.call('HINCRBY', KEYS[1], 'rp', -1)
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], 'rc', '1')
  return 0
end
if pending ~= 0 or redis.call('HEXISTS', KEYS[1], 'rc') == 1 then return 0 end
return 1
