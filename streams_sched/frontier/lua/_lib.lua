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

-- Bitmap back-end: a scalable, blocked Bloom filter kept in one string, of 8-byte
-- fingerprint prefixes (the exact set's, below). Layer i holds cap * expansion^i items
-- and sits in the string right after layer i-1. A layer is an array of 64-byte
-- (512-bit) blocks; an item sets k bits inside one block, so a lookup is one GETRANGE
-- and an insert one SETRANGE, whatever k is. Bytes 1-4 of an item pick the block;
-- bytes 5-8 give a start, an odd step and a cubic term (enhanced double hashing in the
-- 512-bit block). `meta` holds the layer count and the items in the newest layer.
-- Layers are sized from the exact false-positive rate of a blocked filter (Poisson
-- load per 512-bit block): BITS8[x] = bits per item / x for an error of 2^-x at
-- k = K8(x), computed once in Python (summing the Poisson series), interpolated, plus
-- 1%. Layer i gets error err * 0.75 * 0.25^i (the sum stays err), so a filter sized
-- right (one layer) costs about 16.4 bits per item at 0.1%.
local MAX_BYTES = 512 * 1024 * 1024
local BITS8 = { 2.0, 1.445, 1.45, 1.4575, 1.466, 1.4783, 1.4943, 1.5125, 1.5333, 1.556,
  1.5809, 1.6092, 1.6408, 1.6743, 1.71, 1.7494, 1.7924, 1.8367, 1.8847, 1.936, 1.99,
  2.0491, 2.1096, 2.1767, 2.244, 2.3196, 2.3952, 2.48, 2.5721, 2.66, 2.7629, 2.8741,
  2.9764, 3.1006, 3.2343, 3.3783 }

local function bitmap_layer(i, cap, err, expansion, offset)
  local lcap = math.floor(cap * expansion ^ i)
  local x = math.min(-math.log(err * 0.75 * 0.25 ^ i) / math.log(2), 35.99)
  x = math.max(x, 1)
  local lo = math.floor(x)
  local ratio = BITS8[lo] + (BITS8[lo + 1] - BITS8[lo]) * (x - lo)
  local bits = lcap * x * ratio * 1.01
  local blocks = math.max(1, math.ceil(bits / 512))
  local k = math.max(1, math.floor(x * (1.05 - 0.012 * x) + 0.5))
  return { cap = lcap, blocks = blocks, k = k, off = offset, size = blocks * 64 }
end

local function bit_positions(fp, k)
  local x = u32(fp, 5)
  local a = x % 512
  local b = 2 * (math.floor(x / 512) % 256) + 1
  local c = math.floor(x / 131072) % 512
  local pos = {}
  for j = 0, k - 1 do
    pos[j + 1] = (a + j * b + c * (j * j * j - j) / 6) % 512
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
    -- allocate the whole layer at once instead of growing the string bit by bit;
    -- with SET below 1 MB, which allocates it exactly (SETRANGE would double it)
    if offset == 0 then
      redis.call('SET', seen, string.rep('\0', l.size), 'KEEPTTL')
    elseif offset + l.size < 1024 * 1024 then
      redis.call('SET', seen, (redis.call('GET', seen) or '') .. string.rep('\0', l.size), 'KEEPTTL')
    else
      redis.call('SETRANGE', seen, offset + l.size - 1, '\0')
    end
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
      if count >= layers[#layers].cap then
        -- full: a new layer, made when an item needs it (a filter filled exactly
        -- to its capacity stays one layer)
        if not grow() then
          return redis.error_reply('STREAMSDEDUPE ' .. seen ..
            ' bitmap Bloom filter reached 512 MB; raise STREAMS_BLOOM_CAPACITY or use RedisBloom')
        end
        newest = ''
      end
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
    end
  end
  if add then
    redis.call('HSET', meta, 'layers', nlayers, 'count', count)
  end
  return out
end

-- Exact sets -----------------------------------------------------------------
-- A site's filter starts exact: a string of 8-byte fingerprints (the first 8
-- bytes of the SHA1), 8 bytes each, no fixed cost. When it would hold more than
-- EXACT_MAX it becomes a Bloom filter of the crawl's capacity (STREAMS_BLOOM_CAPACITY)
-- holding those 8-byte prefixes, and `meta` gets w = 8: workers of 0.1.0 look for it
-- to use the same prefixes. A 64-bit prefix adds a false-positive chance of n / 2^64
-- per lookup (1e-16 at n = 1000).
local EXACT_MAX = 1024

local function exact_has(blob, fp8)
  local init = 1
  while true do
    local s = string.find(blob, fp8, init, true)
    if not s then
      return false
    end
    if s % 8 == 1 then
      return true
    end
    init = s + 1
  end
end

-- Which form a filter is in, in one or two calls: 'exact' (a string of prefixes, or no
-- key yet) with the string, or 'bloom' (converted; a key of another type is 'bloom'
-- too, and bloom_* reply with the wrong-type error).
-- No call here fails on a filter of the crawl's own back-end: a failed call would count
-- in INFO errorstats, which operators watch.
local function filter_form(mode, seen, meta)
  if mode == 'bf' then
    -- an exact set is a string; a RedisBloom filter is not
    local kind = redis.call('TYPE', seen)['ok']
    if kind == 'none' then
      return 'exact', ''
    elseif kind == 'string' then
      return 'exact', redis.call('GET', seen)
    end
    return 'bloom'
  end
  -- bitmap: a Bloom filter keeps its layers in meta; without them the key is an exact set
  if redis.call('HGET', meta, 'layers') then
    return 'bloom'
  end
  local blob = redis.pcall('GET', seen)
  if type(blob) == 'table' then
    return 'bloom'
  end
  return 'exact', blob or ''
end

local function bloom_of(mode, seen, meta, fps, err, cap, expansion, add)
  if mode == 'bf' then
    return bloom_bf(seen, fps, err, cap, expansion, add)
  end
  return bloom_bitmap(seen, meta, fps, err, cap, expansion, add)
end

-- Turn an exact set into a Bloom filter of capacity `cap` holding `prefixes`
-- (the set's and the new ones), keeping the key's TTL (revisit buckets).
local function exact_to_bloom(mode, seen, meta, prefixes, err, cap, expansion)
  local ttl = redis.call('PTTL', seen)
  redis.call('DEL', seen, meta)
  for i = 1, #prefixes, 1000 do
    local part = { unpack(prefixes, i, math.min(i + 999, #prefixes)) }
    local res = bloom_of(mode, seen, meta, part, err, cap, expansion, true)
    if res.err then
      return res
    end
  end
  redis.call('HSET', meta, 'w', '8')
  if ttl > 0 then
    redis.call('PEXPIRE', seen, ttl)
    redis.call('PEXPIRE', meta, ttl)
  end
  return true
end

-- One filter: 1 (new) / 0 (seen) per fingerprint; with add, new ones are recorded.
local function seen_in(mode, seen, meta, fps, err, cap, expansion, add)
  if #fps == 0 then
    return {}
  end
  local form, blob = filter_form(mode, seen, meta)
  local prefixes = {}
  for i = 1, #fps do
    prefixes[i] = string.sub(fps[i], 1, 8)
  end
  if form == 'bloom' then
    return bloom_of(mode, seen, meta, prefixes, err, cap, expansion, add)
  end
  local out, new, batch = {}, {}, {}
  for i, p in ipairs(prefixes) do
    if batch[p] or exact_has(blob, p) then
      out[i] = 0
    else
      out[i] = 1
      if add then
        batch[p] = true
        new[#new + 1] = p
      end
    end
  end
  if #new == 0 then
    return out
  end
  if #blob / 8 + #new <= EXACT_MAX then
    redis.call('SET', seen, blob .. table.concat(new), 'KEEPTTL')
    return out
  end
  local all = {}
  for i = 1, #blob, 8 do
    all[#all + 1] = string.sub(blob, i, i + 7)
  end
  for _, p in ipairs(new) do
    all[#all + 1] = p
  end
  local done = exact_to_bloom(mode, seen, meta, all, err, cap, expansion)
  if type(done) == 'table' then
    return done
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
    local res = seen_in(mode, filters[f][1], filters[f][2], todo, err, cap, expansion, false)
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
  local res = seen_in(mode, filters[1][1], filters[1][2], todo, err, cap, expansion, true)
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

-- Delete a stream once it holds nothing and nothing of it is pending, so a
-- finished site keeps no empty stream and consumer group (about 0.5-1 KB each).
-- Enqueue and promote recreate it (ensure_group) when the site gets work again.
-- Every script acks an entry before it deletes it (XACK, then XDEL), so a stream
-- with no entries has nothing pending either: XLEN alone decides.
local function retire_if_empty(stream)
  if redis.call('XLEN', stream) == 0 then
    redis.call('DEL', stream)
  end
end

-- Stats counters to add: field -> increment. A script collects them and writes
-- them at its end, so several counters cost one write, not a HINCRBY each.
local function count(counts, field, n)
  counts[field] = (counts[field] or 0) + n
end

-- One HINCRBY per field (a script that writes nothing else to stats).
local function add_counts(stats, counts)
  for field, n in pairs(counts) do
    redis.call('HINCRBY', stats, field, n)
  end
end

-- What the workers saw of ONE site's answers (feedback.lua, and ack.lua for healthy
-- answers that ride along with their acks): counters (added to `counts`, see count()),
-- the observed window and the AIMD state. `A` holds feedback.lua's ARGV[1..11] (see
-- its header); returns its reply.
--
-- The observed window is one string, "o_ts,o_n,o_ok,o_rate,o_okrate", that expires
-- OBS_TTL_MS after the last report: one GET and one SET per report. (The previous
-- version kept a hash under another name; its workers go on using that one.)
local function report_answers(policy, counts, obs, A, now)
  local ok, thr, tmo = tonumber(A[1]), tonumber(A[2]), tonumber(A[3])
  local retry_ms = tonumber(A[4]) or 0
  local adaptive = A[6] == '1'
  local decrease, increase = tonumber(A[7]), tonumber(A[8])
  local floor, forget = tonumber(A[9]), tonumber(A[10])

  local OBS_TTL_MS = 3000
  local p = redis.call('HMGET', policy, 'rate', 'robots_delay', 'a_rate', 'a_cut', 'a_inc', 'a_until')
  local o = {}
  local raw = redis.call('GET', obs)
  if raw then
    o = { string.match(raw, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$') }
  end
  local robots = tonumber(p[2])
  if A[5] ~= '' then
    robots = tonumber(A[5])
    redis.call('HSET', policy, 'robots_delay', A[5])
  end
  -- the rate without back-off: the policy's, else 1 / Crawl-delay, else 0 (unlimited)
  local base = tonumber(p[1]) or tonumber(A[11]) or 0
  if base <= 0 and robots and robots > 0 then
    base = 1 / robots
  end

  -- observed answer rate: answers counted over windows of at least one second
  local n = ok + thr + tmo
  local o_ts, o_n, o_ok = tonumber(o[1]), (tonumber(o[2]) or 0) + n, (tonumber(o[3]) or 0) + ok
  local o_rate, o_okrate = tonumber(o[4]) or 0, tonumber(o[5]) or 0
  if o_ts == nil then
    o_ts = now
  elseif now - o_ts >= 1000 then
    o_rate, o_okrate = o_n * 1000 / (now - o_ts), o_ok * 1000 / (now - o_ts)
    o_ts, o_n, o_ok = now, 0, 0
  end
  redis.call('SET', obs, table.concat({ o_ts, o_n, o_ok, tostring(o_rate), tostring(o_okrate) }, ','),
    'PX', OBS_TTL_MS)

  if ok > 0 then
    count(counts, 'answers_ok', ok)
  end
  if thr > 0 then
    count(counts, 'throttled', thr)
  end
  if tmo > 0 then
    count(counts, 'timeouts', tmo)
  end

  local a_rate = tonumber(p[3])
  local a_until = tonumber(p[6]) or 0
  local cut = 0
  if adaptive then
    if retry_ms > 0 and now + retry_ms > a_until then
      a_until = now + retry_ms
      redis.call('HSET', policy, 'a_until', a_until)
      count(counts, 'retry_after_pauses', 1)
    end
    local a_cut = tonumber(p[4])
    if thr + tmo > 0 then
      local cooldown = 1000
      if a_rate then
        cooldown = math.max(1000, 2000 / a_rate)
      end
      if a_cut == nil or now - a_cut >= cooldown then
        local current = a_rate or base
        local served = o_okrate
        if now - o_ts >= 250 and (served <= 0 or o_rate <= 0) then
          served = o_ok * 1000 / (now - o_ts) -- the first second: the partial window
        end
        if current <= 0 then
          -- an unlimited site: start from the rate it was answering at
          current = math.max(o_rate, n)
          if now - o_ts >= 250 then
            current = math.max(current, o_n * 1000 / (now - o_ts))
          end
        end
        local target = current * decrease
        if served > 0 then
          target = math.min(current, served * decrease)
        end
        local low = floor
        if base > 0 then
          low = math.min(floor, base)
        end
        target = math.max(low, target)
        if target < current then
          a_rate = target
          redis.call('HSET', policy, 'a_rate', tostring(a_rate), 'a_cut', now, 'a_inc', now)
          count(counts, 'backoffs', 1)
          cut = 1
        end
      end
    elseif a_rate and ok > 0 then
      local since = now - (tonumber(p[5]) or now)
      if since >= 200 then
        if o_rate >= 0.8 * a_rate then
          a_rate = a_rate + increase * since / 1000
        end
        if (base > 0 and a_rate >= base) or (base <= 0 and a_cut and now - a_cut >= forget) then
          redis.call('HDEL', policy, 'a_rate', 'a_inc')
          a_rate = nil
        else
          redis.call('HSET', policy, 'a_rate', tostring(a_rate), 'a_inc', now)
        end
      end
    end
  end
  if a_until <= now then
    a_until = 0
  end
  return { a_rate and tostring(a_rate) or '', a_until, tostring(o_rate), cut }
end

-- Shard indexes -----------------------------------------------------------------
-- Every site's keys share its shard's hash tag with the shard's indexes (keys.py):
--   ready[t]  ZSET site -> ms from which it may be leased, for task type t (1 http, 2 browser):
--             sites with backlog of that type, or with delayed requests (in both)
--   leased    ZSET site -> ms of a lease it holds (a takeover looks once that is a lease old)
--   inbox     HASH site -> a small site's queued requests, cmsgpack {code, payload, ...},
--             then UNCOUNTED (see below)
-- A site with one queued URL keeps it in the inbox: no stream, no consumer group, and no
-- stats hash: the requests of a list marked UNCOUNTED are added to the site's enqueued
-- counter when they move into its streams (inbox_flush), and status.lua adds them until
-- then. A list without the mark was written by 0.1.0, which counted it at enqueue: the
-- mark is what keeps a crawl 0.1.0 left in Redis counted exactly. It is a second msgpack
-- value after the list, which 0.1.0's cmsgpack.unpack returns and ignores: its workers
-- still read these lists.

-- Most requests a site keeps in the inbox; more, and they move to its streams.
local INBOX_MAX = 8
local UNCOUNTED = 'u' -- the msgpack of the integer 117
local UNCOUNTED_VALUE = 117

-- A packed inbox value: its flat list {code, payload, ...}, and whether it is counted.
local function inbox_unpack(packed)
  local list, mark = cmsgpack.unpack(packed)
  return list, mark ~= UNCOUNTED_VALUE
end

-- The requests a site keeps in the inbox ({} none), and whether they are counted in its
-- enqueued counter (false for none: a new list is written uncounted).
local function inbox_list(inbox, site)
  local packed = redis.call('HGET', inbox, site)
  if not packed then
    return {}, false
  end
  return inbox_unpack(packed)
end

-- Move a site's inbox requests into its streams, in their order. A site keeps requests
-- in the inbox only while it has no stream: enqueue writes the inbox only then, and
-- everything else that adds to a stream (a lease, promote.lua, requeue_dead.lua)
-- flushes the inbox first. Returns false if the inbox was empty, else the count moved
-- per stream index: the site's whole backlog, nothing pending. Requests not yet counted
-- are counted in the site's stats (enqueued) now. A caller that has just read the list
-- (inbox_list) passes it and whether it is counted.
local function inbox_flush(inbox, site, streams, group, stats, list, counted)
  if not list then
    local packed = redis.call('HGET', inbox, site)
    if not packed then
      return false
    end
    list, counted = inbox_unpack(packed)
  elseif #list == 0 then
    return false
  end
  if not counted then
    redis.call('HINCRBY', stats, 'enqueued', #list / 2)
  end
  local moved = {}
  for i = 1, #list, 2 do
    local idx = tonumber(list[i])
    if not moved[idx] then
      redis.call('XGROUP', 'CREATE', streams[idx], group, '0', 'MKSTREAM')
      moved[idx] = 0
    end
    redis.call('XADD', streams[idx], '*', 'r', list[i + 1])
    moved[idx] = moved[idx] + 1
  end
  redis.call('HDEL', inbox, site)
  return moved
end

-- Backlog per task type {http, browser}, pending, over a site's streams (inbox not
-- included: a lease flushes it first, status counts it itself).
local function site_backlog(streams, group, read_only)
  local backlog, pending = { 0, 0 }, 0
  for t = 1, 2 do
    for b = 1, BANDS do
      local n, p = backlog_of(streams[(t - 1) * BANDS + b], group, read_only)
      backlog[t] = backlog[t] + n
      pending = pending + p
    end
  end
  return backlog, pending
end

-- The due time (ms) of a site's first delayed request, -1 none.
local function next_due_of(delayed)
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2])
  end
  return -1
end

-- Put a site in its shard's indexes as its state says: in ready[t] from `at` (ms) while
-- it has backlog of type t, from its next due time while it has delayed requests, out
-- of it otherwise; in leased while it has pending entries (`lease_at`: the score of a
-- site not yet there; a site already there keeps its older one).
local function reindex(ready, leased, site, backlog, pending, next_due, at, lease_at)
  for t = 1, 2 do
    if backlog[t] > 0 then
      redis.call('ZADD', ready[t], at, site)
    elseif next_due >= 0 then
      redis.call('ZADD', ready[t], next_due, site)
    else
      redis.call('ZREM', ready[t], site)
    end
  end
  if pending > 0 then
    redis.call('ZADD', leased, 'NX', lease_at, site)
  else
    redis.call('ZREM', leased, site)
  end
end

-- A site got backlog of task type t (1 http, 2 browser): ready from `at` at the latest.
local function mark_ready(ready, t, site, at)
  redis.call('ZADD', ready[t], 'LT', at, site)
end

-- 1 if any of a site's streams has a pending entry, else 0.
local function has_pending(streams, group)
  if redis.call('EXISTS', unpack(streams)) == 0 then
    return 0
  end
  for _, stream in ipairs(streams) do
    if redis.call('XLEN', stream) > 0 then
      local info = redis.pcall('XPENDING', stream, group)
      if type(info) == 'table' and not info.err and tonumber(info[1]) > 0 then
        return 1
      end
    end
  end
  return 0
end
