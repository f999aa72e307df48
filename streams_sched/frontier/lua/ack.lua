-- ack.lua: acknowledge finished requests of SEVERAL sites of one shard and delete
-- them, so Redis memory follows the backlog, not the crawl's history. A stream left
-- empty with nothing pending is deleted with its group (enqueue recreates it), and a
-- site left with nothing pending leaves the shard's leased index.
--
-- include: codes, time, rate, streams, answers
--
-- KEYS[1]      leased    ZSET of the shard's sites with leased entries
-- KEYS[2..]    per site, 9 keys:
--              stats     HASH of counters
--              streams   http:high http:default http:low browser:high browser:default browser:low
--              policy    HASH of the site's policy and politeness state (see feedback.lua)
--              window    the site's observed answer window (see feedback.lua)
-- ARGV[1]      consumer group
-- ARGV[2..]    per site: site name, n (0, or 11 when the site's healthy answers ride along:
--              feedback.lua's ARGV[1..11], reported here instead of in a feedback.lua call of
--              their own), those n values, m, then m pairs: stream index (1-6), entry id
-- Returns per site the number of entries acked and deleted now (an entry another worker
-- already acked, after taking over an expired lease, counts 0; one whose lease a failover
-- lost, but not the entry, counts 1).
--
-- Besides the total (field acked), acks of a site that still has work are counted in six
-- 10-second buckets
-- (fields ack0..ack5, slot = bucket % 6, absent = 0; ack_b = the newest bucket written),
-- so status can tell the rate over the last minute (streams_sched/politeness/rates.py).

local group = ARGV[1]
local leased_ix = KEYS[1]
local now = nil

local function ack_site(k, site, a, n_answers, first, last)
  local K = { KEYS[k], KEYS[k + 7], KEYS[k + 8] }
  local streams = { KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], KEYS[k + 6] }
  local counts = {}
  if n_answers > 0 then
    now = now or now_ms()
    report_answers(K[2], counts, K[3], { unpack(ARGV, a, a + n_answers - 1) }, now)
  end
  local by_stream = {}
  for i = first, last, 2 do
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
    local stream = streams[s]
    if stream then
      local n = redis.call('XACK', stream, group, unpack(ids))
      if n == #ids and redis.call('XLEN', stream) == n then
        -- the stream holds just these entries (all were pending, and every script acks
        -- an entry before it deletes it): delete it with its group in one command
        redis.call('DEL', stream)
        acked = acked + n
      else
        -- count what this call deletes, not what it acks: after a failover the new
        -- primary may hold an entry whose lease it never saw, and this ack finishes it
        acked = acked + redis.call('XDEL', stream, unpack(ids))
        retire_if_empty(stream)
      end
    end
  end
  if redis.call('EXISTS', unpack(streams)) == 0 then
    -- the site is done for now: it leaves the leased index, and its counters take one
    -- HINCRBY (a per-site rate over the last minute means nothing for it)
    redis.call('ZREM', leased_ix, site)
    if acked > 0 then
      tally(counts, 'acked', acked)
    end
    add_counts(K[1], counts)
    return acked
  end
  if has_pending(streams, group) == 0 then
    redis.call('ZREM', leased_ix, site)
  end
  if acked == 0 then
    add_counts(K[1], counts)
    return 0
  end
  -- The counters, the ack bucket and its slot: one HMGET and one HSET.
  tally(counts, 'acked', acked)
  local bucket = math.floor((now or now_ms()) / 10000)
  local slot = 'ack' .. (bucket % 6)
  local fields = { 'ack_b', slot }
  for field in pairs(counts) do
    fields[#fields + 1] = field
  end
  local cur = redis.call('HMGET', K[1], unpack(fields))
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
        redis.call('HDEL', K[1], unpack(stale))
      end
    end
  end
  redis.call('HSET', K[1], unpack(out))
  return acked
end

local replies = {}
local k, i = 2, 2
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  local m = tonumber(ARGV[i + 2 + n])
  local first = i + 3 + n
  replies[#replies + 1] = ack_site(k, ARGV[i], i + 2, n, first, first + 2 * m - 1)
  k = k + 9
  i = first + 2 * m
end
return replies
