-- promote.lua: move due delayed requests of ONE site into their streams.
-- Safe with many movers at once: the script is atomic, so a member is moved once.
--
-- include: codes, time, streams, delayed, inbox, index
--
-- KEYS[1]      delayed   ZSET of waiting requests, score = due time in ms
-- KEYS[2]      dlq       dead-letter stream (for malformed members)
-- KEYS[3]      stats     HASH of counters
-- KEYS[4..9]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[10]     ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[11]     ready:browser  ZSET of the shard's sites with browser work
-- KEYS[12]     inbox          HASH of the shard's small sites' queued requests (flushed first)
-- ARGV[1]      consumer group
-- ARGV[2]      max members to move
-- ARGV[3]      the site's name (its member in the shard's indexes)
-- Returns the number moved.

local streams = { KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9] }
local now = now_ms()
if redis.call('ZCARD', KEYS[1]) > 0 then
  inbox_flush(KEYS[12], ARGV[3], streams, ARGV[1], KEYS[3])
end
local moved = promote_due(KEYS[1], KEYS[2], KEYS[3], streams, ARGV[1], now, tonumber(ARGV[2]))
if moved > 0 then
  local backlog = site_backlog(streams, ARGV[1], false)
  for t = 1, 2 do
    if backlog[t] > 0 then
      mark_ready({ KEYS[10], KEYS[11] }, t, ARGV[3], now)
    end
  end
end
return moved
