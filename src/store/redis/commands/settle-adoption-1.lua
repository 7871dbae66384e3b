-- KEYS: session hash. ARGV: epoch, the upstream's verdict on one adoption:
-- 'confirmed', 'refused' (it does not know the session) or 'unanswered'
-- (no answer, or one that says nothing of the session).
-- Settles one pending adoption of the session in that epoch (adopt-6): a
-- refusal is noted in the record (rd). Returns 1 when the record is to be
-- dropped (no adoption of the epoch confirmed, none still pending; reset.lua
-- drops it, marked deleted when one was refused), else 0. Nothing is done
-- when the record is gone or in another epoch, and nothing dropped for a
-- settlement no adoption counted.
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local pending = redis.call('HINCRBY', KEYS[1], 'rp', -1)
if ARGV[2] == 'confirmed' then
  redis.call('HSET', KEYS[1], 'rc', '1')
  return 0
end
if ARGV[2] == 'refused' then redis.call('HSET', KEYS[1], 'rd', '1') end
if pending ~= 0 or redis.call('HEXISTS', KEYS[1], 'rc') == 1 then return 0 end
return 1
