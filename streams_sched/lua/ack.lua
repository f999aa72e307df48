-- ack.lua: acknowledge finished requests of ONE site and delete them, so Redis
-- memory follows the backlog, not the crawl's history. A stream left empty with
-- nothing pending is deleted with its group (enqueue recreates it).
--
-- KEYS[1]      stats     HASH of counters
-- KEYS[2..7]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[8]      policy    HASH of the site's policy and politeness state (see feedback.lua)
-- KEYS[9]      obs       HASH, the site's observed answer window (see feedback.lua)
-- ARGV[1]      consumer group
-- ARGV[2]      n: 0, or 11 when the site's healthy answers ride along (feedback.lua's ARGV,
--              reported here instead of in a feedback.lua call of their own: one script
--              per finished page instead of two on a broad crawl)
-- ARGV[3..2+n] feedback.lua's ARGV[1..11]
-- ARGV[3+n..]  pairs: stream index (1-6), entry id
-- Returns the number of entries acked now (an entry another worker already
-- acked, after taking over an expired lease, counts 0).
--
-- Besides the total (field acked), acks are counted in six 10-second buckets
-- (fields ack0..ack5, slot = bucket % 6, absent = 0; ack_b = the newest bucket written),
-- so status can tell the rate over the last minute (streams_sched/rates.py).

local group = ARGV[1]
local n_answers = tonumber(ARGV[2])
local now = nil
local counts = {}
if n_answers > 0 then
  now = now_ms()
  report_answers(KEYS[8], counts, KEYS[9], { unpack(ARGV, 3, 2 + n_answers) }, now)
end
local by_stream = {}
for i = 3 + n_answers, #ARGV, 2 do
  local s = tonumber(ARGV[i])
  local ids = by_stream[s]
  if not ids then
    ids = {}
    by_stream[s] = ids
  end
  ids[#ids + 1] = ARGV[i + 1]
end
local acked = 0
for s, ids in pairs(by_stream) do
  local stream = KEYS[1 + s]
  if stream then
    acked = acked + redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
    retire_if_empty(stream)
  end
end
if acked == 0 then
  add_counts(KEYS[1], counts)
  return 0
end
-- The counters, the ack bucket and its slot: one HMGET and one HSET.
count(counts, 'acked', acked)
local bucket = math.floor((now or now_ms()) / 10000)
local slot = 'ack' .. (bucket % 6)
local fields = { 'ack_b', slot }
for field in pairs(counts) do
  fields[#fields + 1] = field
end
local cur = redis.call('HMGET', KEYS[1], unpack(fields))
local out = {}
for i = 3, #fields do
  out[#out + 1] = fields[i]
  out[#out + 1] = (tonumber(cur[i]) or 0) + counts[fields[i]]
end
local last = tonumber(cur[1])
out[#out + 1] = slot
if bucket == last then
  out[#out + 1] = (tonumber(cur[2]) or 0) + acked
else
  -- a new bucket: its slot starts over, and the slots of buckets since the last one
  -- written are deleted, not zeroed (a finished site keeps one slot, not six)
  out[#out + 1] = acked
  out[#out + 1] = 'ack_b'
  out[#out + 1] = bucket
  if last then
    local stale = {}
    for b = math.max(last + 1, bucket - 5), bucket - 1 do
      stale[#stale + 1] = 'ack' .. (b % 6)
    end
    if #stale > 0 then
      redis.call('HDEL', KEYS[1], unpack(stale))
    end
  end
end
redis.call('HSET', KEYS[1], unpack(out))
return acked
