-- enqueue.lua: dedupe and add a batch of requests of ONE site, atomically,
-- so a fingerprint is never recorded without its request.
--
-- KEYS[1]      delayed      ZSET of waiting requests, score = due time in ms
-- KEYS[2]      stats        HASH of counters
-- KEYS[3]      policy       HASH of the site's policy (task_type routes requests)
-- KEYS[4..9]   streams      http:high http:default http:low browser:high browser:default browser:low
-- KEYS[10..]   pairs of Bloom filter keys (filter, its meta): the current filter first
--              (new fingerprints go there), then older revisit buckets (only looked at)
-- ARGV[1]      consumer group name
-- ARGV[2]      dedupe back-end: 'bf' or 'bitmap'
-- ARGV[3]      Bloom error rate
-- ARGV[4]      Bloom initial capacity
-- ARGV[5]      Bloom expansion factor
-- ARGV[6]      seconds the current filter lives (revisit buckets; 0 = forever)
-- ARGV[7]      default task type of the crawl ('http' or 'browser')
-- ARGV[8..]    groups of 4 per request: fingerprint ('' = dont_filter), stream code
--              (1-6; or 11-13 = band 1-3 with the task type from the site's policy;
--              see _codes.lua),
--              delay in ms ('0' = now; due = Redis TIME + delay), payload
-- Returns {added, duplicates, delayed, flags, over_cap}; flags has one char per request:
-- '1' added, '0' duplicate, 'c' dropped over the site's page cap.

local group, mode = ARGV[1], ARGV[2]
local err, cap, expansion = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local streams = { KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9] }
local filters = {}
for i = 10, #KEYS, 2 do
  filters[#filters + 1] = { KEYS[i], KEYS[i + 1] }
end

-- the site's policy fields enqueue reads: task_type (routes site-task codes), max_pages
local pol = redis.call('HMGET', KEYS[3], 'task_type', 'max_pages')
local site_task = pol[1] or ARGV[7]
local fps, fp_at = {}, {}
for i = 8, #ARGV, 4 do
  if ARGV[i] ~= '' then
    fps[#fps + 1] = ARGV[i]
    fp_at[i] = #fps
  end
end

local fresh = dedupe(mode, filters, fps, err, cap, expansion)
if fresh.err then
  return fresh
end
if ttl > 0 and #fps > 0 then
  redis.call('EXPIRE', filters[1][1], ttl, 'NX')
  redis.call('EXPIRE', filters[1][2], ttl, 'NX')
end

-- Page cap (policy max_pages, 0 = none): once that many requests with a fingerprint were
-- accepted (stats field pages), new ones are dropped and counted (over_cap).
-- Requests without a fingerprint (dont_filter: retries) are neither counted nor dropped.
local over = {}
local over_cap, pages_in = 0, 0
local max_pages = tonumber(pol[2] or '')
if max_pages and max_pages > 0 then
  local left = max_pages - tonumber(redis.call('HGET', KEYS[2], 'pages') or '0')
  for i = 8, #ARGV, 4 do
    local n = fp_at[i]
    if n and fresh[n] ~= 0 then
      if left <= 0 then
        over[i] = true
        over_cap = over_cap + 1
      else
        left = left - 1
        pages_in = pages_in + 1
      end
    end
  end
end

local now = nil -- Redis TIME, read only for a delayed request
local added, dups, delayed = 0, 0, 0
local flags = {}
local ready = {}
for i = 8, #ARGV, 4 do
  local n = fp_at[i]
  if n and fresh[n] == 0 then
    dups = dups + 1
    flags[#flags + 1] = '0'
  elseif over[i] then
    flags[#flags + 1] = 'c'
  else
    local idx, delay, payload = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
    if idx > SITE_TASK then
      idx = idx - SITE_TASK + (site_task == 'browser' and BANDS or 0)
    end
    local stream = streams[idx]
    if not stream then
      return redis.error_reply('STREAMSARG stream index ' .. tostring(ARGV[i + 1]) .. ' out of range')
    end
    if delay and delay > 0 then
      local seq = redis.call('HINCRBY', KEYS[2], 'delay_seq', 1)
      now = now or now_ms()
      redis.call('ZADD', KEYS[1], now + delay, idx .. ':' .. seq .. ':' .. payload)
      delayed = delayed + 1
    else
      if not ready[idx] then
        ensure_group(stream, group)
        ready[idx] = true
      end
      redis.call('XADD', stream, '*', 'r', payload)
    end
    added = added + 1
    flags[#flags + 1] = '1'
  end
end

if added > 0 then
  redis.call('HINCRBY', KEYS[2], 'enqueued', added)
end
if dups > 0 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', dups)
end
if delayed > 0 then
  redis.call('HINCRBY', KEYS[2], 'delayed_in', delayed)
end
if pages_in > 0 then
  redis.call('HINCRBY', KEYS[2], 'pages', pages_in)
end
if over_cap > 0 then
  redis.call('HINCRBY', KEYS[2], 'over_cap', over_cap)
end
return { added, dups, delayed, table.concat(flags), over_cap }
