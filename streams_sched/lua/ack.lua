-- ack.lua: acknowledge finished requests of ONE site and delete them, so Redis
-- memory follows the backlog, not the crawl's history.
--
-- KEYS[1]      stats     HASH of counters
-- KEYS[2..7]   streams   http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group
-- ARGV[2..]    pairs: stream index (1-6), entry id
-- Returns the number of entries acked now (an entry another worker already
-- acked, after taking over an expired lease, counts 0).

local group = ARGV[1]
local by_stream = {}
for i = 2, #ARGV, 2 do
  local s = tonumber(ARGV[i])
  local ids = by_stream[s]
  if not ids then
    ids = {}
    by_stream[s] = ids
  end
  ids[#ids + 1] = ARGV[i + 1]
end
local acked = 0
for s, ids in pairs(by_stream) do
  local stream = KEYS[1 + s]
  if stream then
    acked = acked + redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
  end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[1], 'acked', acked)
end
return acked
