-- ack.lua: acknowledge finished requests of SEVERAL sites of one shard and delete
-- them, so Redis memory follows the backlog, not the crawl's history. A stream left
-- empty with nothing pending is deleted with its group (enqueue recreates it), and a
-- site left with nothing pending leaves the shard's leased index.
--
-- include: codes, time, rate, streams, answers, freshness
--
-- KEYS[1]      leased    ZSET of the shard's sites with leased entries
-- KEYS[2]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[3]      ready:browser  ZSET of the shard's sites with browser work
-- KEYS[4..]    per site, 9 keys (+1 delayed, +1 revisit_stops with tracked pages):
--              stats     HASH of counters
--              streams   http:high http:default http:low browser:high browser:default browser:low
--              policy    HASH of the site's policy and politeness state (see feedback.lua)
--              window    the site's observed answer window (see feedback.lua)
-- ARGV[1]      consumer group
-- ARGV[2..]    per site: site name, n (0, or 11 when the site's healthy answers ride along:
--              feedback.lua's ARGV[1..11], reported here instead of in a feedback.lua call of
--              their own), those n values, m, then m pairs: stream index (1-6), entry id,
--              then r; when r > 0, the crawl's default rate ('' none), the share of the
--              site's rate its revisits may need and the rule ('f' freshness, 'n' Nutch's);
--              then r tracked pages, 7 values each:
--              stream index (1-6), entry id, ms until the next visit (-1: no longer
--              tracked), flags ('n' first visit, 'e' first visit whose server dated the
--              page's last change, so its interval came from an estimate, 'c' changed,
--              'u' unchanged, '' neither),
--              payload (the request to visit again), the page's interval after and before
--              this visit (ms, 0 = none)
-- Returns per site the number of entries acked and deleted now (an entry another worker
-- already acked, after taking over an expired lease, counts 0; one whose lease a failover
-- lost, but not the entry, counts 1).
--
-- Only a site with tracked pages in the call (r > 0 below) has a 10th and 11th key, its
-- delayed ZSET of waiting requests (lib/delayed.lua) and its revisit_stops SET: an
-- untracked page's ack passes no key it does not use.
--
-- revisit_stops holds the URLs `streams-sched revisits --stop` stopped while no visit of
-- them was waiting (one in flight, or promoted into a stream): a page whose URL is there
-- is not scheduled again, and leaves the set. The site's policy field revisit_stops says
-- the set may hold some, so the set is read only then, and payloads are decoded only
-- while it is not empty; a page visited for the first time leaves the set too (it was enqueued
-- again after the stop, and is tracked from now on).
--
-- A tracked page is rescheduled here, in the script that acks it, and only when this
-- call deletes its entry: a worker killed before the ack leaves the entry pending (taken
-- over, crawled and rescheduled by another), and of two workers acking one entry after a
-- takeover only the one whose XDEL removes it schedules the next visit. So no page is
-- lost and none is scheduled twice. The next time is Redis TIME plus the worker's delay;
-- the site goes into its ready indexes from that time (ZADD LT keeps an earlier one).
-- A site whose policy revisit is 'off' schedules none (its tracked pages stop).
-- Stats: tracked (pages tracked now), revisits (visits rescheduled), changed (revisits
-- whose page had changed), unchanged, tdemand (the fetches per second the site's tracked
-- pages need, in millionths: the sum of 1 / interval) and stretch (in thousandths, absent
-- when 1).
--
-- The site's budget first: when tdemand is above the share of the site's rate its
-- revisits may take, every next visit this call schedules is stretched by the factor
-- between them. Every page's delay grows by the same factor, so the pages spread evenly
-- over what the site allows instead of piling up overdue, where whichever came first
-- would be fetched and the rest would wait. The rate is the site's own (policy rate, else
-- the crawl's default, else its robots.txt Crawl-delay), not a back-off's, which passes.
--
-- Under the freshness rule the pages' intervals spend the budget themselves: the site's
-- multiplier (policy field rv_mu, lib/freshness.lua) moves with every call toward the
-- value at which tdemand equals the budget, and lease.lua carries it to the workers, which
-- choose each page's next interval from it (worker/freshness.py). The stretch then only
-- catches a demand 10% over the budget (the first round, or pages whose min needs more).
--
-- Besides the total (field acked), acks of a site that still has work are counted in six
-- 10-second buckets
-- (fields ack0..ack5, slot = bucket % 6, absent = 0; ack_b = the newest bucket written),
-- so status can tell the rate over the last minute (streams_sched/politeness/rates.py).

local group = ARGV[1]
local leased_ix = KEYS[1]
local ready = { KEYS[2], KEYS[3] }
local now = nil

-- A page's share of its site's revisit demand, in millionths of a fetch per second.
local function demand_of(interval_ms)
  if interval_ms <= 0 then
    return 0
  end
  return math.floor(1e9 / interval_ms + 0.5)
end

-- Ack the tracked pages of ARGV[first..] (r of them) and put each one this call deletes
-- in the delayed ZSET for its next visit, stretched when the site's tracked pages need
-- more than its budget. Returns the entries deleted.
local function stopped_url(stops, payload)
  local ok, d = pcall(cmsgpack.unpack, payload)
  local url = ok and type(d) == 'table' and d.u
  if type(url) == 'string' and redis.call('SREM', stops, url) == 1 then
    return true
  end
  return false
end

local function revisit(site, streams, stats, policy, delayed, stops, first, r, counts)
  local d_rate, share, rule = ARGV[first - 3], tonumber(ARGV[first - 2]), ARGV[first - 1]
  local deleted = 0
  local p = redis.call('HMGET', policy, 'revisit', 'rate', 'robots_delay', 'revisit_stops', 'rv_mu')
  -- `streams-sched revisits --stop` sets the site's policy revisit to 'off': whatever a
  -- worker leased before it learned that, no page of the site is scheduled again
  local off = p[1] == 'off'
  -- the policy's revisit_stops says the stopped-URL set may hold URLs (it expires)
  local any_stops = false
  if p[4] and not off then
    any_stops = redis.call('SCARD', stops) > 0
    if not any_stops then
      redis.call('HDEL', policy, 'revisit_stops')
    end
  end
  local due_pages = {}
  local change = 0
  -- adaptive pages whose interval the worker chose from the site's multiplier
  local compared = 0
  for i = first, first + 7 * (r - 1), 7 do
    local idx = tonumber(ARGV[i])
    local stream = streams[idx]
    if stream then
      local id = ARGV[i + 1]
      redis.call('XACK', stream, group, id)
      if redis.call('XDEL', stream, id) == 1 then
        deleted = deleted + 1
        local delay, flags = tonumber(ARGV[i + 2]), ARGV[i + 3]
        local interval, prev = tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6])
        local new = flags == 'n' or flags == 'e'
        if off then
          delay = -1
        elseif any_stops and delay >= 0 and stopped_url(stops, ARGV[i + 4]) and not new then
          delay = -1
        end
        if not new then
          change = change - demand_of(prev)
        end
        if delay < 0 then
          if not new then
            tally(counts, 'tracked', -1)
          end
        else
          if new then
            tally(counts, 'tracked', 1)
          end
          if flags == 'e' then
            -- the first visit's estimate chose its interval: it moves the multiplier
            compared = compared + 1
          end
          change = change + demand_of(interval)
          due_pages[#due_pages + 1] = { idx, delay, ARGV[i + 4] }
          tally(counts, 'revisits', 1)
          if flags == 'c' then
            tally(counts, 'changed', 1)
            compared = compared + 1
          elseif flags == 'u' then
            tally(counts, 'unchanged', 1)
            compared = compared + 1
          end
        end
      end
      retire_if_empty(stream)
    end
  end
  -- the site's demand, stretch and member sequence: one HMGET, and one HSET below
  local cur = redis.call('HMGET', stats, 'tdemand', 'stretch', 'tracked')
  local demand = tonumber(cur[1]) or 0
  local out = {}
  if change ~= 0 then
    demand = math.max(0, demand + change)
    out[#out + 1] = 'tdemand'
    out[#out + 1] = demand
  end
  if #due_pages > 0 then
    local stretch = 1
    local rate = base_rate(p[2], d_rate, p[3], true)
    local over = 1
    if rule == 'f' and rate > 0 and compared > 0 then
      over = 1.1
      local mu = next_mu(tonumber(p[5]), demand / 1e6, rate * share, compared, tonumber(cur[3]) or compared)
      redis.call('HSET', policy, 'rv_mu', string.format('%.6g', mu))
    end
    if rate > 0 and demand / 1e6 > rate * share * over then
      stretch = demand / 1e6 / (rate * share * over)
      local permille = math.floor(stretch * 1000 + 0.5)
      if tonumber(cur[2]) ~= permille then
        out[#out + 1] = 'stretch'
        out[#out + 1] = permille
      end
    elseif cur[2] then
      redis.call('HDEL', stats, 'stretch')
    end
    now = now or now_ms()
    local soonest = {}
    for _, page in ipairs(due_pages) do
      local due = now + math.floor(page[2] * stretch)
      -- no sequence number ("<stream>::<payload>"): a page is tracked once, so its member
      -- is unique without one, and a waiting page is a few bytes shorter
      redis.call('ZADD', delayed, due, page[1] .. '::' .. page[3])
      local t = task_of(page[1])
      if not soonest[t] or due < soonest[t] then
        soonest[t] = due
      end
    end
    -- the site is ready, for its pages' task type, from its soonest visit (ZADD LT keeps
    -- an earlier one)
    for t, due in pairs(soonest) do
      redis.call('ZADD', ready[t], 'LT', due, site)
    end
  end
  if #out > 0 then
    redis.call('HSET', stats, unpack(out))
  end
  return deleted
end

-- Ack and delete entries of one stream (their ids are the varargs), and delete the stream
-- when they were all it held. Returns the entries this call deleted.
local function ack_entries(stream, ...)
  local n = redis.call('XACK', stream, group, ...)
  if n == select('#', ...) and redis.call('XLEN', stream) == n then
    -- the stream holds just these entries (all were pending, and every script acks
    -- an entry before it deletes it): delete it with its group in one command
    redis.call('DEL', stream)
    return n
  end
  -- count what this call deletes, not what it acks: after a failover the new
  -- primary may hold an entry whose lease it never saw, and this ack finishes it
  local deleted = redis.call('XDEL', stream, ...)
  retire_if_empty(stream)
  return deleted
end

local function ack_site(k, site, a, n_answers, first, last, r)
  local K = { KEYS[k], KEYS[k + 7], KEYS[k + 8] }
  local streams = { KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], KEYS[k + 6] }
  -- counters to add besides acked: only a site with answers or tracked pages has any
  local counts = (n_answers > 0 or r > 0) and {} or nil
  if n_answers > 0 then
    now = now or now_ms()
    report_answers(K[2], counts, K[3], { unpack(ARGV, a, a + n_answers - 1) }, now)
  end
  local acked = 0
  if r > 0 then
    acked = revisit(site, streams, K[1], K[2], KEYS[k + 9], KEYS[k + 10], last + 5, r, counts)
  end
  if last == first + 1 then
    -- one entry (a one-page site's): no table of ids per stream
    local stream = streams[tonumber(ARGV[first])]
    if stream then
      acked = acked + ack_entries(stream, ARGV[last])
    end
  else
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
    for s, ids in pairs(by_stream) do
      local stream = streams[s]
      if stream then
        acked = acked + ack_entries(stream, unpack(ids))
      end
    end
  end
  if redis.call('EXISTS', unpack(streams)) == 0 then
    -- the site is done for now: it leaves the leased index, and its counters take one
    -- HINCRBY (a per-site rate over the last minute means nothing for it)
    redis.call('ZREM', leased_ix, site)
    if counts then
      if acked > 0 then
        tally(counts, 'acked', acked)
      end
      add_counts(K[1], counts)
    elseif acked > 0 then
      redis.call('HINCRBY', K[1], 'acked', acked)
    end
    return acked
  end
  if has_pending(streams, group) == 0 then
    redis.call('ZREM', leased_ix, site)
  end
  if acked == 0 then
    if counts then
      add_counts(K[1], counts)
    end
    return 0
  end
  -- The counters, the ack bucket and its slot: one HMGET and one HSET.
  counts = counts or {}
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
local k, i = 4, 2
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  local m = tonumber(ARGV[i + 2 + n])
  local first = i + 3 + n
  local r = tonumber(ARGV[first + 2 * m])
  replies[#replies + 1] = ack_site(k, ARGV[i], i + 2, n, first, first + 2 * m - 1, r)
  k = k + 9
  if r > 0 then
    k = k + 2
  end
  i = first + 2 * m + 1
  if r > 0 then
    i = i + 3 + 7 * r
  end
end
return replies
