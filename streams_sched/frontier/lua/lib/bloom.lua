-- bloom.lua: a site's seen filter, the dedupe of enqueue.lua: an exact set of 8-byte
-- fingerprint prefixes while it is small, then a Bloom filter (RedisBloom's BF.* or a
-- bitmap kept in one string), and looking fingerprints up or adding them across the
-- revisit buckets (dedupe). Only enqueue.lua includes it: Redis runs a script's whole
-- text at every call, and defining this code costs an ack or a lease about as much as one
-- more Redis command.
-- needs: (nothing)

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
