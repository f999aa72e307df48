-- reindex.lua: put ONE site in its shard's indexes as its keys say: in the ready
-- index of each task type it has backlog of (or delayed requests), in the leased
-- index while it has pending entries, in the shard's site registry. For keys written
-- by something other than these scripts: an operator's repair, a test that writes a
-- stream itself.
--
-- include: codes, time, streams, delayed, inbox, index
--
-- KEYS[1]      delayed        ZSET of waiting requests
-- KEYS[2..7]   streams        http:high http:default http:low browser:high browser:default browser:low
-- KEYS[8]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[9]      ready:browser  ZSET of the shard's sites with browser work
-- KEYS[10]     leased         ZSET of the shard's sites with leased entries
-- KEYS[11]     inbox          HASH of the shard's small sites' queued requests
-- KEYS[12]     sites          SET, the shard's site registry
-- ARGV[1]      consumer group
-- ARGV[2]      the site's name
-- ARGV[3]      score of a site that enters the leased index (ms; 0 = look at its leases now)
-- Returns {backlog http, backlog browser, pending, delayed}

local group, site = ARGV[1], ARGV[2]
local streams = { KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7] }
local backlog, pending = site_backlog(streams, group, false)
local list = inbox_list(KEYS[11], site)
for i = 1, #list, 2 do
  local t = task_of(tonumber(list[i]))
  backlog[t] = backlog[t] + 1
end
local delayed = redis.call('ZCARD', KEYS[1])
local next_due = delayed > 0 and next_due_of(KEYS[1]) or -1
reindex({ KEYS[8], KEYS[9] }, KEYS[10], site, backlog, pending, next_due, now_ms(), tonumber(ARGV[3]))
redis.call('SADD', KEYS[12], site)
return { backlog[1], backlog[2], pending, delayed }
