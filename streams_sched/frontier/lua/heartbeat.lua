-- heartbeat.lua: write a node's record in the crawl's nodes hash, stamped with the time
-- Redis received it. Liveness (service/liveness.py) compares last_seen with Redis TIME,
-- so it must be on that clock: a worker whose own clock is 30 s behind would otherwise
-- look dead while it crawls, and a killed one 30 s ahead alive for 30 s more.
--
-- include: (nothing)
--
-- KEYS[1]  nodes  HASH of the crawl's nodes: node id -> JSON record
-- ARGV[1]  node id
-- ARGV[2]  the record: a JSON object without last_seen (the script adds it, in epoch
--          seconds, as its first member)
-- Returns Redis TIME {seconds, microseconds}: the worker's reading of the crawl's clock
-- (frontier/clock.py).

local t = redis.call('TIME')
local body = string.sub(ARGV[2], 2)
if string.sub(body, 1, 1) ~= '}' then
  body = ', ' .. body
end
local seen = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('HSET', KEYS[1], ARGV[1], '{"last_seen": ' .. seen .. body)
return t
