-- read_site.lua: ONE site as `streams-sched dump` reads it (transfer/sitereader.py), and as
-- the moment of that read: its state and its first chunk of requests ('first'), or the
-- next chunk from the cursors the last one gave ('next'). Read-only: run with EVALSHA_RO
-- or EVAL_RO, so a read-only ACL user can dump, and a chunk reads at most ARGV[4]
-- entries: a site with a long backlog is read in many short calls, never in one long one.
-- Between two calls workers go on: the reader checks with each chunk that nothing it has
-- yet to read moved inside the site (lib/snapshot.lua returns what to check), and reads
-- a frozen copy instead (freeze_site.lua) when something did.
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
-- then         the site's seen keys to read whole ('first' only), any number
-- ARGV[1]      consumer group
-- ARGV[2]      the site's name (its field in the inbox)
-- ARGV[3]      'first' or 'next'
-- ARGV[4]      most entries to read in this call
-- ARGV[5..19]  'next': the cursors, per stream its cursor and its last id at the snapshot
--              (12 values), the delayed ZSET's cursor member, the dead letters' cursor and
--              last id (lib/snapshot.lua)
-- Returns 'first': {the snapshot's head (lib/snapshot.lua: snapshot_head), its first chunk};
--         'next': {the checks (snapshot_checks), the chunk}

local site_keys = { KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10] }
local group, budget = ARGV[1], tonumber(ARGV[4])
if ARGV[3] == 'first' then
  local filters = {}
  for i = 13, #KEYS do
    filters[#filters + 1] = KEYS[i]
  end
  local head = snapshot_head(site_keys, group, ARGV[2], KEYS[11], KEYS[12], filters)
  local cursors = {}
  for s = 1, STREAM_COUNT do
    cursors[2 * s - 1] = ''
    cursors[2 * s] = head[6][s][2]
  end
  cursors[13] = ''
  cursors[14] = ''
  cursors[15] = head[8]
  return { head, snapshot_chunk(site_keys, group, cursors, budget) }
end
local cursors = {}
for i = 5, 19 do
  cursors[#cursors + 1] = ARGV[i]
end
return { snapshot_checks(site_keys, group), snapshot_chunk(site_keys, group, cursors, budget) }
