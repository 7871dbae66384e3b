-- Request stream recorders (src/cluster/recorder-liveness.ts). The session
-- hash's w:<stream> field names the replica recording a request stream; each
-- replica keeps a liveness key `<prefix>r:<replicaId>:alive` (PX LEASE_TTL_MS,
-- refreshed in every lease tick). That key is not the session's: a script
-- cannot read it on Cluster, so a replica reads it first (GET) and the script
-- below checks what it can in one slot: the stream is still unended and still
-- recorded by that replica. Replica ids are never reused (random per process),
-- so a recorder found dead stays dead.
--
-- KEYS: session hash. ARGV: streamId, replicaId.
-- Returns 0 when the session is unknown, else 1.
if redis.call('HEXISTS', KEYS[1], 'epoch') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'w:' .. ARGV[1], ARGV[2])
return 1
