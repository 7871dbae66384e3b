-- Whether an append carrying the lease token `fence` ('' for none) is
-- refused: another replica holds the lease. A lease that merely expired
-- (nobody took it) does not refuse (see append-5).
local function fencedOff (lease, fence)
  if fence == '' then return false end
  local holder = redis.call('GET', lease)
  return holder ~= false and holder ~= fence
end
