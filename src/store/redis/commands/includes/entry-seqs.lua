-- Sequence numbers of a batch entry, from its id `<first seq>-<count>`. */
local function countOf (id)
  return tonumber(string.sub(id, string.find(id, '-', 1, true) + 1))
end
local function firstOf (id)
  return tonumber(string.sub(id, 1, string.find(id, '-', 1, true) - 1))
end
local function lastOf (id)
  return firstOf(id) + countOf(id) - 1
end
