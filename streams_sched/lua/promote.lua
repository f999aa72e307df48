-- promote.lua: move due delayed requests of ONE site into their streams.
-- Safe with many movers at once: the script is atomic, so a member is moved once.
--
-- KEYS[1]      delayed   ZSET of waiting requests, score = due time in ms
-- KEYS[2]      dlq       dead-letter stream (for malformed members)
-- KEYS[3]      stats     HASH of counters
-- KEYS[4..9]   streams   http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group
-- ARGV[2]      max members to move
-- Returns the number moved.

local streams = { KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9] }
return promote_due(KEYS[1], KEYS[2], KEYS[3], streams, ARGV[1], now_ms(), tonumber(ARGV[2]))
