-- KEYS: session hash. ARGV: kind (log_level, subscribe, unsubscribe,
-- untracked), the request (log_level) or the resource URI (empty for
-- untracked), most subscriptions, most bytes of their URIs.
-- Keeps a request that set session state in the session's recipe, compacted
-- as store/session-recipe.ts does: the last log level; the subscribed URIs
-- as a set (JSON array, field rs), marked incomplete (rx) past the bound or
-- when the state was set in a way the recipe cannot follow (untracked).
-- Nothing when the session has no recipe (ri). Returns 1 when kept.
local meta, kind, value = KEYS[1], ARGV[1], ARGV[2]
if not redis.call('HGET', meta, 'ri') then return 0 end
if kind == 'untracked' then
  redis.call('HSET', meta, 'rx', '1')
  return 1
end
if kind == 'log_level' then
  redis.call('HSET', meta, 'rl', value)
  return 1
end
if kind == 'subscribe' and redis.call('HGET', meta, 'rx') then return 0 end
local list = cjson.decode(redis.call('HGET', meta, 'rs') or '[]')
local out, bytes, found = {}, 0, false
for _, uri in ipairs(list) do
  if uri == value then
    found = true
    if kind == 'subscribe' then out[#out + 1] = uri; bytes = bytes + #uri end
  else
    out[#out + 1] = uri
    bytes = bytes + #uri
  end
end
if kind == 'subscribe' and not found then
  out[#out + 1] = value
  bytes = bytes + #value
  if #out > tonumber(ARGV[3]) or bytes > tonumber(ARGV[4]) then
    redis.call('HSET', meta, 'rx', '1')
    return 0
  end
end
-- cjson writes an empty table as {}: an empty list is written by hand.
redis.call('HSET', meta, 'rs', #out == 0 and '[]' or cjson.encode(out))
return 1
