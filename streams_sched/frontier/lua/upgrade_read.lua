-- upgrade_read.lua: what ONE site's keys of the per-site layout hold, and the DUMP and
-- PTTL of those that exist (streams-sched upgrade, streams_sched/admin/upgrade.py). Read-only.
-- Not one of the worker's scripts: only the upgrade runs it, on keys Frontier does not name.
--
-- KEYS[1..]    the site's old keys, streams first (ARGV[2] of them), in upgrade.key_pairs order
-- ARGV[1]      consumer group
-- ARGV[2]      how many of KEYS are streams
-- ARGV[3]      position in KEYS of the delayed ZSET
-- ARGV[4]      position in KEYS of the dead-letter stream
-- ARGV[5]      position in KEYS of the stats HASH
-- Returns {per stream: length, pending; delayed, dead letters, enqueued ('' none),
--          then per key that exists: its position, DUMP, PTTL}
local group, streams = ARGV[1], tonumber(ARGV[2])
local out = {}
for s = 1, streams do
  local len = redis.call('XLEN', KEYS[s])
  local pending = 0
  if len > 0 then
    local info = redis.pcall('XPENDING', KEYS[s], group)
    if type(info) == 'table' and not info.err then
      pending = tonumber(info[1])
    end
  end
  out[#out + 1] = len
  out[#out + 1] = pending
end
out[#out + 1] = redis.call('ZCARD', KEYS[tonumber(ARGV[3])])
out[#out + 1] = redis.call('XLEN', KEYS[tonumber(ARGV[4])])
out[#out + 1] = redis.call('HGET', KEYS[tonumber(ARGV[5])], 'enqueued') or ''
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = i
    out[#out + 1] = redis.call('DUMP', key)
    out[#out + 1] = redis.call('PTTL', key)
  end
end
return out
