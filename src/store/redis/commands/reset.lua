-- KEYS: session hash, lease, attached marker, deletion mark, then the key of
-- every stream the caller found in the hash, then their ledgers.
-- ARGV: new epoch ('' to only delete), principal, ttlMs, the record's other
-- fields as a JSON object of strings ('' for none), an epoch to delete only
-- in ('' for any), '1' to leave the deletion mark ('' not to), then the ids
-- of those streams.
-- Deletes the session and, given an epoch, writes a fresh record; without one
-- (a deletion) leaves, when asked, the deletion mark for ttlMs, so a replica
-- still reading one of the session's answers tells a deletion from a store
-- that lost the session (and does not record it again). Returns 1 when done,
-- 3 when done with the deletion mark; 0
-- without touching anything when the hash lists other streams than the caller
-- passed (a stream was opened meanwhile): the caller reads them again and
-- retries, so every key stays declared in KEYS. Given an epoch to delete
-- only in, returns 2 without touching anything when the record is in another
-- epoch (or gone), or an adoption of it was confirmed or is still pending
-- (adopt-6, settle-adoption-1); otherwise the deletion is marked also when
-- an adoption of it was refused (whichever settlement asked for the drop).
local mark = ARGV[6] == '1'
if ARGV[5] ~= '' then
  local rec = redis.call('HMGET', KEYS[1], 'epoch', 'rc', 'rp', 'rd')
  if rec[1] ~= ARGV[5] or rec[2] or tonumber(rec[3] or '0') ~= 0 then return 2 end
  if rec[4] then mark = true end
end
local count, known = 0, {}
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 'q:' then
    known[string.sub(field, 3)] = true
    count = count + 1
  end
end
if count ~= #ARGV - 6 or #KEYS ~= 4 + 2 * count then return 0 end
for i = 7, #ARGV do
  if not known[ARGV[i]] then return 0 end
end
for i = 1, #KEYS, 500 do
  redis.call('DEL', unpack(KEYS, i, math.min(i + 499, #KEYS)))
end
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'principal', ARGV[2])
  if ARGV[4] ~= '' then
    for field, value in pairs(cjson.decode(ARGV[4])) do redis.call('HSET', KEYS[1], field, value) end
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
elseif mark then
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[3])
  return 3
end
return 1
