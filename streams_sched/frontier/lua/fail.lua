-- fail.lua: leases of ONE site whose delivery failed (a browser task that did not
-- render: a navigation timeout, a crashed tab). Each entry the consumer still owns
-- goes back to the end of its stream with this delivery counted (field d), so any
-- capable worker retries it; an entry that has had max deliveries goes to the
-- dead-letter stream instead, with the reason the worker gave. An entry taken over
-- by another consumer meanwhile is left to it.
--
-- include: codes, time, streams, index
--
-- KEYS[1]      dlq       dead-letter stream
-- KEYS[2]      stats     HASH of counters
-- KEYS[3..8]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[9]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[10]     ready:browser  ZSET of the shard's sites with browser work
-- KEYS[11]     leased         ZSET of the shard's sites with leased entries
-- ARGV[1]      consumer group
-- ARGV[2]      consumer that owns the leases (recorded in a dead letter)
-- ARGV[3]      the site's name (its member in the shard's indexes)
-- ARGV[4]      max deliveries
-- ARGV[5..]    triples: stream index (1-6), entry id, what went wrong
-- Returns {entries requeued, entries dead-lettered}.

local group, consumer, site = ARGV[1], ARGV[2], ARGV[3]
local max_deliveries = tonumber(ARGV[4])
local now = now_ms()
local requeued, dead = 0, 0
local typed = {}
for i = 5, #ARGV, 3 do
  local code = tonumber(ARGV[i])
  local stream = KEYS[2 + code]
  local id, what = ARGV[i + 1], ARGV[i + 2]
  if stream and redis.call('EXISTS', stream) == 1 then
    local p = redis.call('XPENDING', stream, group, id, id, 1, consumer)
    if #p > 0 then
      local found = redis.call('XRANGE', stream, id, id)
      local payload, d = false, 0
      if #found > 0 then
        payload, d = entry_fields(found[1][2])
      end
      -- deliveries so far, this failed one included
      local total = d + tonumber(p[1][4])
      if payload and total < max_deliveries then
        redis.call('XADD', stream, '*', 'r', payload, 'd', total)
        typed[task_of(code)] = true
        requeued = requeued + 1
      else
        local reason = 'delivered ' .. total .. ' times (STREAMS_MAX_DELIVERIES=' .. max_deliveries ..
          '), the last failed: ' .. what
        if not payload then
          reason = 'entry has no payload field r'
        end
        dead_letter(KEYS[1], KEYS[2], stream, id, payload, reason, total, consumer, now)
        dead = dead + 1
      end
      redis.call('XACK', stream, group, id)
      redis.call('XDEL', stream, id)
      retire_if_empty(stream)
    end
  end
end
if requeued > 0 then
  redis.call('HINCRBY', KEYS[2], 'failed', requeued)
  for t = 1, 2 do
    if typed[t] then
      mark_ready({ KEYS[9], KEYS[10] }, t, site, now)
    end
  end
end
if requeued + dead > 0 and has_pending({ KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8] }, group) == 0 then
  redis.call('ZREM', KEYS[11], site)
end
return { requeued, dead }
