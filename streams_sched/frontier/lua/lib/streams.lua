-- streams.lua: a site's request streams and their entries: making a stream's consumer
-- group, counting backlog and pending entries, reading an entry's fields, dead-lettering
-- an entry, and deleting a stream left empty.
-- needs: codes
--
-- Stream entries have the fields:
--   r  the request payload (msgpack, opaque to Lua)
--   d  deliveries before this one (absent: 0); set when an entry is requeued
-- Dead letters have: r, reason, stream, id, deliveries, node, ts.

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

-- Backlog per task type {http, browser}, pending, over a site's streams (inbox not
-- included: a lease flushes it first, status counts it itself).
local function site_backlog(streams, group, read_only)
  local backlog, pending = { 0, 0 }, 0
  for t = 1, 2 do
    for b = 1, BANDS do
      local n, p = backlog_of(streams[stream_of(t, b)], group, read_only)
      backlog[t] = backlog[t] + n
      pending = pending + p
    end
  end
  return backlog, pending
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

-- A tracked page's part of its site's tracked count and revisit demand (ack.lua), read
-- from its payload: 0, 0 for a request that is not a tracked page. The payload is
-- msgpack with the request's meta under 'mt', and a tracked page's state under meta._rv,
-- a list whose first value is its interval in ms (worker/revisits.py). Only a payload
-- with the string '_rv' is decoded, so an untracked request costs a substring search;
-- one cmsgpack cannot read still counts as a page, without its demand, which ack.lua
-- keeps from falling below 0.
local function tracked_share(payload)
  if not payload or not string.find(payload, '\163_rv', 1, true) then
    return 0, 0
  end
  local ok, d = pcall(cmsgpack.unpack, payload)
  if not ok then
    return 1, 0
  end
  local state = type(d) == 'table' and type(d.mt) == 'table' and d.mt._rv
  if type(state) ~= 'table' then
    return 0, 0
  end
  local interval_ms = tonumber(state[1])
  if not interval_ms or interval_ms <= 0 then
    return 1, 0
  end
  return 1, math.floor(1e9 / interval_ms + 0.5)
end

-- A tracked page that becomes a dead letter is no longer tracked; requeued, it is again
-- (sign -1 and 1): its site's tracked count and demand follow.
local function count_tracked(stats, payload, sign)
  local n, demand = tracked_share(payload)
  if n > 0 then
    redis.call('HINCRBY', stats, 'tracked', sign)
    if demand > 0 then
      local left = redis.call('HINCRBY', stats, 'tdemand', sign * demand)
      if left < 0 then
        redis.call('HSET', stats, 'tdemand', 0)
      end
    end
  end
end

local function dead_letter(dlq, stats, stream, id, payload, reason, deliveries, node, now)
  redis.call('XADD', dlq, '*', 'r', payload or '', 'reason', reason, 'stream', stream,
    'id', id, 'deliveries', deliveries, 'node', node, 'ts', now)
  redis.call('HINCRBY', stats, 'dead', 1)
  count_tracked(stats, payload, -1)
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
