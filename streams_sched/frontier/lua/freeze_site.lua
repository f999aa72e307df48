-- freeze_site.lua: copy ONE site's requests (its streams with their consumer group and
-- leases, its delayed ZSET, its dead letters) to short-lived keys of its shard, and take
-- the snapshot of its state at the same moment, for `streams-sched dump` to read the
-- copies at leisure (read_site.lua 'next' on them). A dump uses it for a site that moved
-- under its chunked read. COPY costs Redis about 0.15 us per stream entry and 1 us per
-- delayed member, in this one call.
--
-- include: codes, time, snapshot
--
-- KEYS[1]      delayed   ZSET of waiting requests
-- KEYS[2]      dlq       dead-letter stream
-- KEYS[3]      stats     HASH of counters
-- KEYS[4]      policy    HASH of the site's policy
-- KEYS[5..10]  streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[11]     inbox     HASH of the shard's small sites' queued requests
-- KEYS[12]     journal   STREAM of what enqueue.lua adds to the shard while a dump reads it
-- then         8 keys: where delayed, dlq and the six streams are copied (scratch keys
--              of the shard), then the site's seen keys to read whole, any number
-- ARGV[1]      consumer group
-- ARGV[2]      the site's name (its field in the inbox)
-- ARGV[3]      ms the copies live
-- Returns the snapshot's head (lib/snapshot.lua: snapshot_head).

local site_keys = { KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10] }
local copies = { 1, 2, 5, 6, 7, 8, 9, 10 }
for i, from in ipairs(copies) do
  local to = KEYS[12 + i]
  redis.call('DEL', to)
  if redis.call('COPY', KEYS[from], to) == 1 then
    redis.call('PEXPIRE', to, ARGV[3])
  end
end
local filters = {}
for i = 21, #KEYS do
  filters[#filters + 1] = KEYS[i]
end
return snapshot_head(site_keys, ARGV[1], ARGV[2], KEYS[11], KEYS[12], filters)
