-- prune.lua: remove consumers of ONE site's streams that own no pending entries
-- (workers that are gone). A consumer that still owns entries is never removed:
-- XGROUP DELCONSUMER would drop its pending entries, and nobody could claim them.
-- The check and the removal are one atomic call, so a consumer that leases an
-- entry in between cannot lose it.
--
-- include: (nothing)
--
-- KEYS[1..6]   streams   http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group
-- ARGV[2..]    pairs: stream index (1-6), consumer name
-- Returns the number of consumers removed.

local group = ARGV[1]
local removed = 0
for i = 2, #ARGV, 2 do
  local stream = KEYS[tonumber(ARGV[i])]
  local consumer = ARGV[i + 1]
  if stream and redis.call('EXISTS', stream) == 1 then
    local p = redis.pcall('XPENDING', stream, group, '-', '+', 1, consumer)
    if type(p) == 'table' and not p.err and #p == 0 then
      redis.call('XGROUP', 'DELCONSUMER', stream, group, consumer)
      removed = removed + 1
    end
  end
end
return removed
