-- snapshot.lua: what `streams-sched dump` reads of one site (transfer/sitereader.py): its
-- state at the moment of the read (where the shard's journal is, the inbox, the policy,
-- the counters, the seen filters, where each stream and the dead letters end), then its
-- requests a bounded chunk at a time.
-- needs: codes, time
--
-- Site keys, in this order (read_site.lua and freeze_site.lua take them first):
--   delayed, dlq, stats, policy, streams (6)
-- A chunk reads up to a budget of entries over the parts in this order: each stream from
-- a cursor (the last id read, '' the start) to where it ended at the snapshot, then the
-- delayed ZSET from a cursor member, by rank, then the dead letters up to where they
-- ended. A part's next cursor is the last id (member) read, '!' when it is read through,
-- and for the delayed ZSET '?' when the cursor member is gone (the caller starts over).

-- the counters a dump keeps (pages, tracked pages and their demand and stretch) and those
-- that say a request moved inside the site (a chunked read checks them)
local SNAPSHOT_STATS = { 'pages', 'tracked', 'tdemand', 'stretch', 'delay_seq', 'failed', 'released', 'reclaimed',
  'dead', 'promoted', 'revisits', 'dlq_requeued' }

-- The consumer group's last delivered id ('' none: no stream, or no group).
local function last_delivered(stream, group)
  if redis.call('EXISTS', stream) == 0 then
    return ''
  end
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then
    return ''
  end
  for _, g in ipairs(groups) do
    local name, ld = nil, ''
    for i = 1, #g, 2 do
      if g[i] == 'name' then
        name = g[i + 1]
      elseif g[i] == 'last-delivered-id' then
        ld = g[i + 1]
      end
    end
    if name == group then
      return ld
    end
  end
  return ''
end

-- The id of a stream's last entry ('' none).
local function last_id(stream)
  local e = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  return e[1] and e[1][1] or ''
end

-- A filter key as {type, pttl, value}: a string whole, a hash as a flat list, a RedisBloom
-- filter as its BF.SCANDUMP chunks (iterator, data, ...); {'none'} when it does not exist.
local function filter_value(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'none' then
    return { 'none' }
  end
  local pttl = redis.call('PTTL', key)
  if kind == 'string' then
    return { kind, pttl, redis.call('GET', key) }
  elseif kind == 'hash' then
    return { kind, pttl, redis.call('HGETALL', key) }
  end
  local chunks, iter = {}, 0
  repeat
    local part = redis.call('BF.SCANDUMP', key, iter)
    iter = tonumber(part[1])
    if iter ~= 0 then
      chunks[#chunks + 1] = iter
      chunks[#chunks + 1] = part[2]
    end
  until iter == 0
  return { kind, pttl, chunks }
end

-- The state of a site at this moment (see the header). `site_keys` as above; `inbox` and
-- `journal` the shard's; `filters` the site's seen keys to read whole.
local function snapshot_head(site_keys, group, site, inbox, journal, filters)
  local streams = {}
  for s = 1, STREAM_COUNT do
    local stream = site_keys[4 + s]
    streams[s] = { last_delivered(stream, group), last_id(stream) }
  end
  local f = {}
  for i, key in ipairs(filters) do
    f[i] = filter_value(key)
  end
  return {
    now_ms(),
    last_id(journal),
    redis.call('HGET', inbox, site) or '',
    redis.call('HGETALL', site_keys[4]),
    redis.call('HMGET', site_keys[3], unpack(SNAPSHOT_STATS)),
    streams,
    redis.call('ZCARD', site_keys[1]),
    last_id(site_keys[2]),
    f,
  }
end

-- Entries of a stream after `cursor` up to `last`, at most `n`: {entries, pending, next}
-- where pending lists the entries among them a consumer holds (id, consumer, idle ms,
-- deliveries, ...).
local function stream_chunk(stream, group, cursor, last, n)
  if cursor == '!' or last == '' then
    return { {}, {}, '!' }
  end
  if n <= 0 then
    return { {}, {}, cursor }
  end
  local from = cursor == '' and '-' or '(' .. cursor
  local entries = redis.call('XRANGE', stream, from, last, 'COUNT', n)
  local pending = {}
  if group and #entries > 0 then
    local p = redis.pcall('XPENDING', stream, group, entries[1][1], entries[#entries][1], #entries)
    if type(p) == 'table' and not p.err then
      pending = p
    end
  end
  local nxt = '!'
  if #entries == n and entries[#entries][1] ~= last then
    nxt = entries[#entries][1]
  end
  return { entries, pending, nxt }
end

-- Members of the delayed ZSET after the cursor member (by rank), with their scores.
local function delayed_chunk(delayed, cursor, n)
  if cursor == '!' then
    return { {}, '!' }
  end
  if n <= 0 then
    return { {}, cursor }
  end
  local start = 0
  if cursor ~= '' then
    local rank = redis.call('ZRANK', delayed, cursor)
    if not rank then
      return { {}, '?' }
    end
    start = rank + 1
  end
  local got = redis.call('ZRANGE', delayed, start, start + n - 1, 'WITHSCORES')
  local nxt = '!'
  if #got == 2 * n then
    nxt = got[#got - 1]
  end
  return { got, nxt }
end

-- A chunk of at most `budget` entries over the parts, from `cursors` (ARGV, see read_site.lua):
-- {per stream {entries, pending, next}, {delayed members and scores, next}, {dead letters, next}}
local function snapshot_chunk(site_keys, group, cursors, budget)
  local left = budget
  local out = {}
  for s = 1, STREAM_COUNT do
    local part = stream_chunk(site_keys[4 + s], group, cursors[2 * s - 1], cursors[2 * s], left)
    left = left - #part[1]
    out[s] = part
  end
  local d = delayed_chunk(site_keys[1], cursors[13], left)
  left = left - #d[1] / 2
  out[#out + 1] = d
  local dl = stream_chunk(site_keys[2], false, cursors[14], cursors[15], left)
  out[#out + 1] = { dl[1], dl[3] }
  return out
end

-- What a chunked read checks at every chunk: Redis time, the counters of moves inside the
-- site, and where each stream's consumer group has delivered to.
local function snapshot_checks(site_keys, group)
  local lds = {}
  for s = 1, STREAM_COUNT do
    lds[s] = last_delivered(site_keys[4 + s], group)
  end
  return { now_ms(), redis.call('HMGET', site_keys[3], unpack(SNAPSHOT_STATS)), lds }
end
