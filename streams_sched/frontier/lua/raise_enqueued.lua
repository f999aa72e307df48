-- raise_enqueued.lua: raise a shard's enqueued counter to at least ARGV[1], never lower it
-- (a worker may have counted more since). Run by streams-sched upgrade only.
--
-- KEYS[1]      shard stats    HASH of the shard's counters
-- ARGV[1]      the least the counter must say
-- Returns the counter as it was
local cur = tonumber(redis.call('HGET', KEYS[1], 'enqueued') or '0') or 0
if cur < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'enqueued', ARGV[1])
end
return cur
