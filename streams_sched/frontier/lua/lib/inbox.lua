-- inbox.lua: a small site's requests kept in its shard's inbox instead of streams:
-- reading the list and moving it into the site's streams.
-- needs: (nothing)
--
--   inbox     HASH site -> a small site's queued requests, cmsgpack {code, payload, ...},
--             then UNCOUNTED (see below); its key shares the shard's hash tag (index.lua)
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
