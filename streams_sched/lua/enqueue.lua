-- enqueue.lua: dedupe and add a batch of requests of ONE site, atomically,
-- so a fingerprint is never recorded without its request.
--
-- KEYS[1]      seen         Bloom filter (RedisBloom BF or bitmap string)
-- KEYS[2]      seen:meta    bitmap Bloom layer state (unused with RedisBloom)
-- KEYS[3]      delayed      ZSET of waiting requests, score = due time in ms
-- KEYS[4]      stats        HASH of counters
-- KEYS[5..10]  streams      http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group name
-- ARGV[2]      dedupe back-end: 'bf' or 'bitmap'
-- ARGV[3]      Bloom error rate
-- ARGV[4]      Bloom initial capacity
-- ARGV[5]      Bloom expansion factor
-- ARGV[6..]    groups of 4 per request: fingerprint ('' = dont_filter), stream index (1-6),
--              delay in ms ('0' = now; due = Redis TIME + delay), payload
-- Returns {added, duplicates, delayed, flags}; flags has one char per request:
-- '1' added, '0' duplicate.

local group, mode = ARGV[1], ARGV[2]
local err, cap, expansion = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local streams = { KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10] }

local fps, fp_at = {}, {}
for i = 6, #ARGV, 4 do
  if ARGV[i] ~= '' then
    fps[#fps + 1] = ARGV[i]
    fp_at[i] = #fps
  end
end

local fresh
if mode == 'bf' then
  fresh = bloom_bf(KEYS[1], fps, err, cap, expansion)
else
  fresh = bloom_bitmap(KEYS[1], KEYS[2], fps, err, cap, expansion)
end
if fresh.err then
  return fresh
end

local now = now_ms()
local added, dups, delayed = 0, 0, 0
local flags = {}
local ready = {}
for i = 6, #ARGV, 4 do
  local n = fp_at[i]
  if n and fresh[n] == 0 then
    dups = dups + 1
    flags[#flags + 1] = '0'
  else
    local idx, delay, payload = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
    local stream = streams[idx]
    if not stream then
      return redis.error_reply('STREAMSARG stream index ' .. tostring(ARGV[i + 1]) .. ' out of range')
    end
    if delay and delay > 0 then
      local seq = redis.call('HINCRBY', KEYS[4], 'delay_seq', 1)
      redis.call('ZADD', KEYS[3], now + delay, idx .. ':' .. seq .. ':' .. payload)
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
  redis.call('HINCRBY', KEYS[4], 'enqueued', added)
end
if dups > 0 then
  redis.call('HINCRBY', KEYS[4], 'duplicates', dups)
end
if delayed > 0 then
  redis.call('HINCRBY', KEYS[4], 'delayed_in', delayed)
end
return { added, dups, delayed, table.concat(flags) }
