-- The last command of append-split-6's transaction: the stream back from where
-- it was put aside, if it is (an accepted batch). Sent as EVAL, never
-- EVALSHA: a NOSCRIPT here would leave the stream aside. (A plain RENAME
-- fails when there is nothing to move back: an error reply, which ioredis
-- makes into an Error with its stack.)
-- KEYS: aside, the stream.
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
return 1
