-- Writes one batch entry (id <first seq>-<count>: its size, layout and bytes)
-- and notes its id and size in the stream's ledger (a list, one item per
-- entry, oldest first), which trimForBatch reads instead of the entries
-- themselves. A ledger left from a stream that is gone is dropped first.
local function addEntry (skey, zkey, id, layout, blob, ttl)
  if redis.call('XLEN', skey) == 0 then redis.call('DEL', zkey) end
  redis.call('XADD', skey, id, 's', #blob, 'l', layout, 'b', blob)
  redis.call('RPUSH', zkey, id .. ' ' .. #blob)
  redis.call('PEXPIRE', zkey, ttl)
end
