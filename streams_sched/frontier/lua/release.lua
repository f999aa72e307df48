-- release.lua: hand back leases a consumer will not finish (a worker that is
-- stopping, or a prefetched request it never started). Each entry it still owns
-- goes back to the end of its stream with its delivery count unchanged, so other
-- workers get it at once instead of after the lease expires.
--
-- include: codes, time, streams, index
--
-- KEYS[1]      stats     HASH of counters
-- KEYS[2..7]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[8]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[9]      ready:browser  ZSET of the shard's sites with browser work
-- KEYS[10]     leased         ZSET of the shard's sites with leased entries
-- ARGV[1]      consumer group
-- ARGV[2]      consumer that owns the leases
-- ARGV[3]      the site's name (its member in the shard's indexes)
-- ARGV[4..]    pairs: stream index (1-6), entry id
-- Returns the number of entries handed back.

local group, consumer = ARGV[1], ARGV[2]
local released = 0
local typed = {}
for i = 4, #ARGV, 2 do
  local stream = KEYS[1 + tonumber(ARGV[i])]
  local id = ARGV[i + 1]
  if stream and redis.call('EXISTS', stream) == 1 then
    local p = redis.call('XPENDING', stream, group, id, id, 1, consumer)
    if #p > 0 then
      local found = redis.call('XRANGE', stream, id, id)
      if #found > 0 then
        local payload, d = entry_fields(found[1][2])
        if payload then
          redis.call('XADD', stream, '*', 'r', payload, 'd', d + tonumber(p[1][4]) - 1)
          typed[task_of(tonumber(ARGV[i]))] = true
        end
      end
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
      released = released + 1
    end
  end
end
if released > 0 then
  redis.call('HINCRBY', KEYS[1], 'released', released)
  local now = now_ms()
  for t = 1, 2 do
    if typed[t] then
      mark_ready({ KEYS[8], KEYS[9] }, t, ARGV[3], now)
    end
  end
  if has_pending({ KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7] }, group) == 0 then
    redis.call('ZREM', KEYS[10], ARGV[3])
  end
end
return released
