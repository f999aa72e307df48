-- requeue_dead.lua: put dead letters of ONE site back into the streams they came
-- from, as new entries with a fresh delivery count, and delete them from the
-- dead-letter stream. Atomic, so two operators requeueing at once never
-- requeue a letter twice. A letter without a payload, or from a key that is not
-- one of the site's streams (a malformed delayed-queue member), stays where it is.
-- Requeued letters count as enqueued again (stats: enqueued, dlq_requeued), so
-- enqueued = acked + dead + what is still queued keeps holding.
--
-- include: codes, time, streams, inbox, index
--
-- KEYS[1]      dlq       dead-letter stream
-- KEYS[2]      stats     HASH of counters
-- KEYS[3..8]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[9]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[10]     ready:browser  ZSET of the shard's sites with browser work
-- KEYS[11]     inbox          HASH of the shard's small sites' queued requests (flushed first)
-- ARGV[1]      consumer group
-- ARGV[2]      the site's name (its member in the shard's indexes)
-- ARGV[3..]    dead-letter ids
-- Returns {requeued, kept (no payload or unknown stream), missing (already gone)}

local group = ARGV[1]
local requeued, kept, missing = 0, 0, 0
local now = now_ms()
inbox_flush(KEYS[11], ARGV[2], { KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8] }, group, KEYS[2])
for i = 3, #ARGV do
  local found = redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i])
  if #found == 0 then
    missing = missing + 1
  else
    local payload, origin = false, false
    local fields = found[1][2]
    for j = 1, #fields, 2 do
      if fields[j] == 'r' then
        payload = fields[j + 1]
      elseif fields[j] == 'stream' then
        origin = fields[j + 1]
      end
    end
    local target = false
    local typed = 1
    for s = 3, 2 + STREAM_COUNT do
      if KEYS[s] == origin then
        target = KEYS[s]
        typed = task_of(s - 2)
      end
    end
    if target and payload and payload ~= '' then
      ensure_group(target, group)
      redis.call('XADD', target, '*', 'r', payload)
      count_tracked(KEYS[2], payload, 1)
      mark_ready({ KEYS[9], KEYS[10] }, typed, ARGV[2], now)
      redis.call('XDEL', KEYS[1], ARGV[i])
      requeued = requeued + 1
    else
      kept = kept + 1
    end
  end
end
if requeued > 0 then
  redis.call('HINCRBY', KEYS[2], 'enqueued', requeued)
  redis.call('HINCRBY', KEYS[2], 'dlq_requeued', requeued)
end
return { requeued, kept, missing }
