-- release.lua: hand back leases a consumer will not finish (a worker that is
-- stopping, or a prefetched request it never started). Each entry it still owns
-- goes back to the end of its stream with its delivery count unchanged, so other
-- workers get it at once instead of after the lease expires.
--
-- KEYS[1]      stats     HASH of counters
-- KEYS[2..7]   streams   http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group
-- ARGV[2]      consumer that owns the leases
-- ARGV[3..]    pairs: stream index (1-6), entry id
-- Returns the number of entries handed back.

local group, consumer = ARGV[1], ARGV[2]
local released = 0
for i = 3, #ARGV, 2 do
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
end
return released
