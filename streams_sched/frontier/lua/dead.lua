-- dead.lua: move leased entries of ONE site to the site's dead-letter stream
-- with a reason (for example: the payload cannot be decoded), then ack and
-- delete them.
--
-- include: codes, time, streams
--
-- KEYS[1]      dlq       dead-letter stream
-- KEYS[2]      stats     HASH of counters
-- KEYS[3..8]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[9]      leased    ZSET of the shard's sites with leased entries (lib/index.lua)
-- ARGV[1]      consumer group
-- ARGV[2]      node id (recorded in the dead letter)
-- ARGV[3]      the site's name (its member in the shard's indexes)
-- ARGV[4..]    triples: stream index (1-6), entry id, reason
-- Returns the number of entries moved.

local group, node = ARGV[1], ARGV[2]
local now = now_ms()
local moved = 0
for i = 4, #ARGV, 3 do
  local stream = KEYS[2 + tonumber(ARGV[i])]
  local id, reason = ARGV[i + 1], ARGV[i + 2]
  if stream then
    local found = redis.call('XRANGE', stream, id, id)
    if #found > 0 then
      local payload, d = entry_fields(found[1][2])
      local p = redis.call('XPENDING', stream, group, id, id, 1)
      local count = (p[1] and tonumber(p[1][4])) or 1
      dead_letter(KEYS[1], KEYS[2], stream, id, payload, reason, count + d, node, now)
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
      retire_if_empty(stream)
      moved = moved + 1
    end
  end
end
if has_pending({ KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8] }, group) == 0 then
  redis.call('ZREM', KEYS[9], ARGV[3])
end
return moved
