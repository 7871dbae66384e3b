-- Retention before a batch of n events (blob of `size` bytes, layout in its
-- text form, described in src/store/batch/packed-layout.ts) is added after `last`: f: (keep) is exact per event; storage goes by
-- whole entries, deleted once all their events are below keep, or while the
-- stream is over the byte limit (never the entry being added). Returns keep
-- and the stream's bytes once the batch is in.
local function trimForBatch (skey, zkey, last, first, bytes, n, size, layout, maxEvents, maxBytes)
  local newLast = last + n
  local total = bytes + size
  local keep = first
  if n == 0 then return keep, total end
  if keep < newLast - maxEvents + 1 then keep = newLast - maxEvents + 1 end
  if keep <= first and total <= maxBytes then return keep, total end
  -- Oldest entries first, one at a time. Once the events before keep are gone and
  -- the bytes are within the limit, the next entry stays: it is not even read (a
  -- read copies its whole batch into the script). The ledger gives each entry's id
  -- and size without reading it; while it does not match the stream (one key lost
  -- or expired without the other), entries are read instead.
  local ledger = redis.call('LLEN', zkey) == redis.call('XLEN', skey)
  local cursor, nextFirst, dropped, exhausted = '-', nil, 0, false
  while not (nextFirst and nextFirst >= keep and total <= maxBytes) do
    local id, esize
    if ledger then
      local item = redis.call('LINDEX', zkey, dropped)
      if item then
        local space = string.find(item, ' ', 1, true)
        id, esize = string.sub(item, 1, space - 1), tonumber(string.sub(item, space + 1))
      end
    else
      local row = redis.call('XRANGE', skey, cursor, '+', 'COUNT', 1)[1]
      if row then id, esize = row[1], tonumber(row[2][2]) end
    end
    if not id then
      exhausted = true
      break
    end
    local dash = string.find(id, '-', 1, true)
    local elast = tonumber(string.sub(id, 1, dash - 1)) + tonumber(string.sub(id, dash + 1)) - 1
    if elast >= keep and total <= maxBytes then break end
    total = total - esize
    if keep <= elast then keep = elast + 1 end
    dropped = dropped + 1
    nextFirst = elast + 1
    cursor = '(' .. id
  end
  if dropped > 0 then
    if exhausted then
      redis.call('DEL', skey, zkey)
    else
      redis.call('XTRIM', skey, 'MINID', nextFirst .. '-0')
      if ledger then
        redis.call('LTRIM', zkey, dropped, -1)
      else
        -- Drop what the ledger holds of the entries gone, so that it matches again.
        while true do
          local item = redis.call('LINDEX', zkey, 0)
          if not item or tonumber(string.sub(item, 1, string.find(item, '-', 1, true) - 1)) >= nextFirst then break end
          redis.call('LPOP', zkey)
        end
      end
    end
  end
  if exhausted and total > maxBytes then
    -- The new batch alone is over the limit: hide its oldest events (the newest stays).
    local sizes, i, visible = {}, 0, total
    for _, a, b, c in string.gmatch(layout, '(%d+) (%d+) (%d+) (%d+)') do
      i = i + 1
      sizes[i] = tonumber(a) + tonumber(b) + tonumber(c)
    end
    for seq = last + 1, keep - 1 do visible = visible - sizes[seq - last] end
    while keep < newLast and visible > maxBytes do
      visible = visible - sizes[keep - last]
      keep = keep + 1
    end
  end
  return keep, total
end
