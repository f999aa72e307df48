-- The seen-filter scripts of the layout whose seen filter is a Bloom filter from the start:
-- _lib.lua followed by enqueue.lua, verbatim. tests/test_seen_forms.py creates
-- crawls with them to prove the current scripts continue such crawls.
-- _lib.lua: helpers shared by every script. streams_sched/frontier/scripts.py prepends
-- this file to each script before registering it, so every script stays one
-- atomic server-side call that touches only the keys it is given in KEYS.
--
-- Stream entries have the fields:
--   r  the request payload (msgpack, opaque to Lua)
--   d  deliveries before this one (absent: 0); set when an entry is requeued
-- Delayed members (ZSET, score = due time in ms) are "<stream index>:<seq>:<payload>".
-- Dead letters have: r, reason, stream, id, deliveries, node, ts.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ensure_group(stream, group)
  if redis.call('EXISTS', stream) == 0 then
    redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
  end
end

-- Entries not yet delivered to anyone: the length minus the pending entries
-- (acked entries are deleted, so the length is backlog + pending). A stream
-- without the group gets it (at id 0) unless read_only is set.
-- Returns backlog, pending.
local function backlog_of(stream, group, read_only)
  local len = redis.call('XLEN', stream)
  if len == 0 then
    return 0, 0
  end
  local info = redis.pcall('XPENDING', stream, group)
  if type(info) == 'table' and info.err then
    if not read_only then
      redis.call('XGROUP', 'CREATE', stream, group, '0')
    end
    return len, 0
  end
  local pending = tonumber(info[1])
  return len - pending, pending
end

-- Field table of an entry ({f1, v1, f2, v2}) -> payload (or false), prior deliveries.
local function entry_fields(fields)
  local payload, d = false, 0
  if type(fields) ~= 'table' then
    return payload, d
  end
  for i = 1, #fields, 2 do
    if fields[i] == 'r' then
      payload = fields[i + 1]
    elseif fields[i] == 'd' then
      d = tonumber(fields[i + 1]) or 0
    end
  end
  return payload, d
end

local function dead_letter(dlq, stats, stream, id, payload, reason, deliveries, node, now)
  redis.call('XADD', dlq, '*', 'r', payload or '', 'reason', reason, 'stream', stream,
    'id', id, 'deliveries', deliveries, 'node', node, 'ts', now)
  redis.call('HINCRBY', stats, 'dead', 1)
end

-- Move up to `limit` due delayed requests into their streams. Returns the count moved.
local function promote_due(delayed, dlq, stats, streams, group, now, limit)
  local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
  local moved = 0
  for _, member in ipairs(due) do
    local sep1 = string.find(member, ':', 1, true)
    local sep2 = sep1 and string.find(member, ':', sep1 + 1, true)
    local idx = sep1 and tonumber(string.sub(member, 1, sep1 - 1))
    local stream = idx and streams[idx]
    if stream and sep2 then
      ensure_group(stream, group)
      redis.call('XADD', stream, '*', 'r', string.sub(member, sep2 + 1))
      moved = moved + 1
    else
      dead_letter(dlq, stats, delayed, '', member, 'malformed delayed-queue member', 0, '', now)
    end
    redis.call('ZREM', delayed, member)
  end
  if moved > 0 then
    redis.call('HINCRBY', stats, 'promoted', moved)
  end
  return moved
end

-- Bloom filters ---------------------------------------------------------------

local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

-- RedisBloom back-end: returns a table of 1 (new) / 0 (seen) per fingerprint;
-- with add = false it only looks (1 = not in this filter).
local function bloom_bf(seen, fps, err, cap, expansion, add)
  if #fps == 0 then
    return {}
  end
  local kind = redis.call('TYPE', seen)['ok']
  if kind == 'string' then
    return redis.error_reply('STREAMSDEDUPE ' .. seen ..
      ' holds a bitmap Bloom filter but this worker uses RedisBloom; set STREAMS_DEDUPE="bitmap"')
  end
  if not add then
    local out = {}
    if kind == 'none' then
      for i = 1, #fps do
        out[i] = 1
      end
      return out
    end
    local found = redis.call('BF.MEXISTS', seen, unpack(fps))
    for i = 1, #fps do
      out[i] = 1 - found[i]
    end
    return out
  end
  if kind == 'none' then
    redis.call('BF.RESERVE', seen, err, cap, 'EXPANSION', expansion)
  end
  return redis.call('BF.MADD', seen, unpack(fps))
end

-- Bitmap back-end: a scalable, blocked Bloom filter kept in one string.
-- Layer i holds cap * expansion^i items at error err * 0.5^(i+1) (so the
-- compound error stays under err) and sits in the string right after layer i-1.
-- A layer is an array of 64-byte (512-bit) blocks; an item sets k bits inside
-- one block, so a lookup is one GETRANGE and an insert one SETRANGE, whatever k
-- is. Blocks cost about 10-30% more bits than a classic Bloom filter at the same
-- error. Fingerprints are 20 bytes (SHA1): bytes 1-4 pick the block, bytes 5-20
-- give eight independent bit positions, and any further ones come from
-- enhanced double hashing. `meta` holds the layer count and the items in the
-- newest layer.
local LN2SQ = math.log(2) * math.log(2)
local MAX_BYTES = 512 * 1024 * 1024

local function bitmap_layer(i, cap, err, expansion, offset)
  local lcap = math.floor(cap * expansion ^ i)
  local lerr = err * 0.5 ^ (i + 1)
  local d = -math.log(lerr) / math.log(10)
  local bits = lcap * (-math.log(lerr) / LN2SQ) * (1 + 0.02 * d + 0.01 * d * d)
  local blocks = math.max(1, math.ceil(bits / 512))
  local k = math.floor(0.75 * -math.log(lerr) / math.log(2) + 1.5)
  return { cap = lcap, blocks = blocks, k = k, off = offset, size = blocks * 64 }
end

local function bit_positions(fp, k)
  local pos = {}
  for j = 0, math.min(k, 8) - 1 do
    local a, b = string.byte(fp, 5 + 2 * j, 6 + 2 * j)
    pos[j + 1] = (a * 256 + b) % 512
  end
  if k > 8 then
    local h2, h3, h4 = u32(fp, 5), u32(fp, 9), u32(fp, 13)
    for j = 8, k - 1 do
      pos[j + 1] = (h2 + j * h3 + j * j * h4) % 512
    end
  end
  return pos
end

local function bloom_bitmap(seen, meta, fps, err, cap, expansion, add)
  if #fps == 0 then
    return {}
  end
  local kind = redis.call('TYPE', seen)['ok']
  if kind ~= 'none' and kind ~= 'string' then
    return redis.error_reply('STREAMSDEDUPE ' .. seen .. ' holds a ' .. kind ..
      ' value, not a bitmap Bloom filter; set STREAMS_DEDUPE="redisbloom"')
  end
  local state = redis.call('HMGET', meta, 'layers', 'count')
  local nlayers = tonumber(state[1]) or 0
  local count = tonumber(state[2]) or 0
  local layers = {}
  local offset = 0
  for i = 0, nlayers - 1 do
    layers[i + 1] = bitmap_layer(i, cap, err, expansion, offset)
    offset = offset + layers[i + 1].size
  end
  local function grow()
    local l = bitmap_layer(#layers, cap, err, expansion, offset)
    if offset + l.size > MAX_BYTES then
      return false
    end
    -- allocate the whole layer at once instead of growing the string bit by bit
    redis.call('SETRANGE', seen, offset + l.size - 1, '\0')
    layers[#layers + 1] = l
    offset = offset + l.size
    nlayers = nlayers + 1
    count = 0
    return true
  end
  local out = {}
  if nlayers == 0 then
    if not add then
      for i = 1, #fps do
        out[i] = 1
      end
      return out
    end
    grow()
  end
  local band, bor, lshift = bit.band, bit.bor, bit.lshift
  for n, fp in ipairs(fps) do
    local h1 = u32(fp, 1)
    local found = false
    local pos, newest
    for li = #layers, 1, -1 do
      local l = layers[li]
      if not pos or #pos ~= l.k then
        pos = bit_positions(fp, l.k)
      end
      local block = redis.call('GETRANGE', seen, l.off + (h1 % l.blocks) * 64, l.off + (h1 % l.blocks) * 64 + 63)
      if li == #layers then
        newest = block
      end
      local all = true
      for j = 1, l.k do
        local p = pos[j]
        if band(string.byte(block, math.floor(p / 8) + 1) or 0, lshift(1, 7 - p % 8)) == 0 then
          all = false
          break
        end
      end
      if all then
        found = true
        break
      end
    end
    if found then
      out[n] = 0
    elseif not add then
      out[n] = 1
    else
      local l = layers[#layers]
      pos = bit_positions(fp, l.k)
      local bytes = { string.byte(newest, 1, 64) }
      for i = #bytes + 1, 64 do
        bytes[i] = 0
      end
      for j = 1, l.k do
        local p = pos[j]
        local i = math.floor(p / 8) + 1
        bytes[i] = bor(bytes[i], lshift(1, 7 - p % 8))
      end
      redis.call('SETRANGE', seen, l.off + (h1 % l.blocks) * 64, string.char(unpack(bytes)))
      out[n] = 1
      count = count + 1
      if count >= l.cap and not grow() then
        return redis.error_reply('STREAMSDEDUPE ' .. seen ..
          ' bitmap Bloom filter reached 512 MB; raise STREAMS_BLOOM_CAPACITY or use RedisBloom')
      end
    end
  end
  if add then
    redis.call('HSET', meta, 'layers', nlayers, 'count', count)
  end
  return out
end

-- Dedupe against a list of filters (seen keys with their meta keys): the first is
-- the current one, where new fingerprints are added; the others (older revisit
-- buckets) are only looked at. Returns 1 (new) / 0 (seen) per fingerprint.
local function dedupe(mode, filters, fps, err, cap, expansion)
  local fresh = {}
  for i = 1, #fps do
    fresh[i] = 1
  end
  local todo, at = fps, nil
  for f = #filters, 2, -1 do
    local res
    if mode == 'bf' then
      res = bloom_bf(filters[f][1], todo, err, cap, expansion, false)
    else
      res = bloom_bitmap(filters[f][1], filters[f][2], todo, err, cap, expansion, false)
    end
    if res.err then
      return res
    end
    local keep, keep_at = {}, {}
    for i = 1, #todo do
      local orig = at and at[i] or i
      if res[i] == 0 then
        fresh[orig] = 0
      else
        keep[#keep + 1] = todo[i]
        keep_at[#keep_at + 1] = orig
      end
    end
    todo, at = keep, keep_at
  end
  local res
  if mode == 'bf' then
    res = bloom_bf(filters[1][1], todo, err, cap, expansion, true)
  else
    res = bloom_bitmap(filters[1][1], filters[1][2], todo, err, cap, expansion, true)
  end
  if res.err then
    return res
  end
  for i = 1, #todo do
    local orig = at and at[i] or i
    if res[i] == 0 then
      fresh[orig] = 0
    end
  end
  return fresh
end
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
-- ARGV[8..]    groups of 4 per request: fingerprint ('' = dont_filter), stream index
--              (1-6; or 11-13 = band 1-3 with the task type from the site's policy),
--              delay in ms ('0' = now; due = Redis TIME + delay), payload
-- Returns {added, duplicates, delayed, flags}; flags has one char per request:
-- '1' added, '0' duplicate.

local group, mode = ARGV[1], ARGV[2]
local err, cap, expansion = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local streams = { KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9] }
local filters = {}
for i = 10, #KEYS, 2 do
  filters[#filters + 1] = { KEYS[i], KEYS[i + 1] }
end

local fps, fp_at = {}, {}
local site_task = nil
for i = 8, #ARGV, 4 do
  if ARGV[i] ~= '' then
    fps[#fps + 1] = ARGV[i]
    fp_at[i] = #fps
  end
  if site_task == nil and tonumber(ARGV[i + 1]) > 10 then
    site_task = redis.call('HGET', KEYS[3], 'task_type') or ARGV[7]
  end
end

local fresh = dedupe(mode, filters, fps, err, cap, expansion)
if fresh.err then
  return fresh
end
if ttl > 0 and #fps > 0 then
  redis.call('EXPIRE', filters[1][1], ttl, 'NX')
  if mode ~= 'bf' then
    redis.call('EXPIRE', filters[1][2], ttl, 'NX')
  end
end

local now = now_ms()
local added, dups, delayed = 0, 0, 0
local flags = {}
local ready = {}
for i = 8, #ARGV, 4 do
  local n = fp_at[i]
  if n and fresh[n] == 0 then
    dups = dups + 1
    flags[#flags + 1] = '0'
  else
    local idx, delay, payload = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
    if idx > 10 then
      idx = idx - 10 + (site_task == 'browser' and 3 or 0)
    end
    local stream = streams[idx]
    if not stream then
      return redis.error_reply('STREAMSARG stream index ' .. tostring(ARGV[i + 1]) .. ' out of range')
    end
    if delay and delay > 0 then
      local seq = redis.call('HINCRBY', KEYS[2], 'delay_seq', 1)
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
return { added, dups, delayed, table.concat(flags) }
