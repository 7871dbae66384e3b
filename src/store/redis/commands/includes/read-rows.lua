-- The entries READ returns, read in the script: the one holding `from`,
-- then as many as `limit` events need, or about `maxBytes` bytes.
--- @include "entry-seqs"
local function readRows (skey, from, limit, maxBytes)
  local rows = {}
  local got, size, cursor = 0, 0, '-'
  local head = redis.call('XREVRANGE', skey, tostring(from), '-', 'COUNT', 1)
  if #head > 0 then
    rows[1] = head[1]
    got = math.max(0, lastOf(head[1][1]) - from + 1)
    -- Its bytes from `from` on, estimated by its share of the entry's events
    -- (reading its layout would cost more than the page): with events of
    -- uneven sizes a page may end here, at the entry's end, short of maxBytes.
    size = tonumber(head[1][2][2]) * got / countOf(head[1][1])
    cursor = '(' .. head[1][1]
  end
  while got < limit and size < maxBytes do
    local more = redis.call('XRANGE', skey, cursor, '+', 'COUNT', 4)
    for _, row in ipairs(more) do
      rows[#rows + 1] = row
      got = got + countOf(row[1])
      size = size + tonumber(row[2][2])
      cursor = '(' .. row[1]
      if got >= limit or size >= maxBytes then break end
    end
    if #more < 4 then break end
  end
  return rows
end
