-- enqueue.lua: dedupe and add requests of SEVERAL sites of one shard, atomically,
-- so a fingerprint is never recorded without its request, and a site with work is
-- never missing from its shard's indexes (lib/index.lua).
-- A site with no stream keeps up to INBOX_MAX requests in the shard's inbox: a site
-- with one queued URL costs a hash field, not a stream and its consumer group.
--
-- include: codes, time, streams, inbox, bloom
--
-- KEYS[1]      ready:http     ZSET of the shard's sites with http work
-- KEYS[2]      ready:browser  ZSET of the shard's sites with browser work
-- KEYS[3]      inbox          HASH of the shard's small sites' queued requests
-- KEYS[4]      shard stats    HASH of the shard's counters (enqueued)
-- KEYS[5]      sites          SET, the shard's site registry
-- KEYS[6]      fresh:http     LIST of the shard's new sites with http work due now
-- KEYS[7]      fresh:browser  LIST of the shard's new sites with browser work due now
-- KEYS[8]      journal        STREAM of what is added to the shard while a dump reads it
-- KEYS[9]      halt           STRING set by `streams-sched move` (keys.py): once it says the
--                             crawl has moved ('moved:<url>'), the call adds nothing and
--                             fails with 'CRAWLMOVED <url>' (while it copies, 'pause:...',
--                             requests go in as ever: the journal takes them to the copy)
-- KEYS[10..]   per site, 9 + 2 * ARGV[8] keys (+1 dlq, after the filters, with 'load' keys):
--              delayed        ZSET of waiting requests, score = due time in ms
--              stats          HASH of counters
--              policy         HASH of the site's policy (task_type routes requests)
--              streams (6)    http:high http:default http:low browser:high browser:default browser:low
--              filters        pairs of Bloom filter keys (filter, its meta): the current filter
--                             first (new fingerprints go there), then older revisit buckets
-- ARGV[1]      consumer group name
-- ARGV[2]      dedupe back-end: 'bf' or 'bitmap'
-- ARGV[3]      Bloom error rate
-- ARGV[4]      Bloom initial capacity
-- ARGV[5]      Bloom expansion factor
-- ARGV[6]      seconds the current filter lives (revisit buckets; 0 = forever)
-- ARGV[7]      default task type of the crawl ('http' or 'browser')
-- ARGV[8]      filter pairs per site
-- ARGV[9]      the keys each site has: 'all' (as above), or 'seed': only its stats, then
--              its filter pairs (2 * ARGV[8] keys), for a batch of seeds that are mostly
--              new sites; each site the call cannot take with those keys alone is left
--              untouched and gets {} (send it again with all its keys); or 'load' (below)
-- ARGV[10..]   per site: site name, n, then n groups of 4: fingerprint ('' = dont_filter),
--              stream code (1-6; or 11-13 = band 1-3 with the task type from the site's
--              policy; see lib/codes.lua), delay in ms ('0' = now; due = Redis TIME + delay),
--              payload
-- Returns per site {added, duplicates, delayed, flags, over_cap}; flags has one char per
-- request: '1' added, '0' duplicate, 'c' dropped over the site's page cap. With 'seed'
-- keys, {} for a site that is registered, comes again in the call, or has a delayed
-- request, a band code or more than INBOX_MAX requests.
--
-- 'load' keys (streams-sched load, transfer/load.py): each site has its dlq after its
-- filters, the call's last key is the load's ledger (a bitmap of the lines of one file
-- this crawl has taken), and a request is a group of 6: the 4 above, then its line in
-- the ledger ('' none) and extra. A request whose line is in the ledger was taken before:
-- flag 'l', nothing done; every other request's line goes in, in the same call, so a
-- load run again after a kill takes each line once. Codes beyond the streams':
--   21-26     a dead letter of stream 1-6: its fingerprint is recorded like any other,
--             and it goes to the site's dlq whether it was seen or not; extra is the
--             msgpack array {reason, deliveries, node, ts ms, its id where it came from,
--             the key it came from ('' that stream of the site)}
--   30        seen only (a URL the file says was done): its fingerprint is recorded,
--             nothing is added; flag 's' when it was not seen yet
-- For a request, extra is its earlier failed deliveries ('' none): due now, it goes into
-- its stream (not the inbox, which has no room for them) with field d.
-- 'load-keep' is 'load' for the requests of a dump whose seen filters replace the sites'
-- own after them: each was accepted once, so it goes in whatever the filter says (a Bloom
-- filter would take some for seen at its error rate), its fingerprint recorded as ever.
--
-- The journal exists only while `streams-sched dump` reads this shard (transfer/
-- journal.py): every request added then is appended to it (site s, stream index q, due ms
-- t (0 = now), payload r), so the dump also holds what is added to a site after it read
-- the site. Without a dump the journal costs one EXISTS per call.
--
-- Passing a key or an argument costs Redis time whether the script uses it or not (about
-- a third of a new site's share of a call): a new site in the common case needs only its
-- stats and filter keys, which is why seeding sends those alone and then the few sites
-- that need more again.
--
-- A site missing from the shard's registry has no seen filter, stream, inbox field or
-- task_type, max_pages or ready_at in its policy: what writes them (this script, a
-- policy, lease.lua) registers the site first or in the same script, and a purge deletes
-- its keys before the registration. Such a new site, which is most sites while a broad
-- crawl is seeded, skips the reads of its policy, filter, streams and inbox, and the
-- filters and inbox fields of the call's new sites are written in one command each.
-- Such a site with only requests due now goes at the end of its shard's fresh list, not
-- in the ready index: a list member costs about 25 bytes where a ZSET member costs 115,
-- and lease.lua moves fresh sites into the ready index as it names sites.

local group, mode = ARGV[1], ARGV[2]
local err, cap, expansion = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])
local n_filters = tonumber(ARGV[8])
local seed_keys = ARGV[9] == 'seed'
local keep_seen = ARGV[9] == 'load-keep'
local load_keys = ARGV[9] == 'load' or keep_seen
-- values per request in ARGV
local STRIDE = load_keys and 6 or 4
-- where a site's stats and first filter key are among its keys, and how many keys it has
local AT_STATS, AT_FILTERS = 1, 9
if seed_keys then
  AT_STATS, AT_FILTERS = 0, 1
end
local PER_SITE = AT_FILTERS + 2 * n_filters + (load_keys and 1 or 0)
local FIRST_SITE_ARG = 10
local ready = { KEYS[1], KEYS[2] }
local inbox, sites_ix = KEYS[3], KEYS[5]
local new_site_lists = { KEYS[6], KEYS[7] }
local journal = KEYS[8]
local FIRST_SITE_KEY = 10
local halt = redis.call('GET', KEYS[9])
if halt and string.sub(halt, 1, 6) == 'moved:' then
  return redis.error_reply('CRAWLMOVED ' .. string.sub(halt, 7))
end
local ledger = load_keys and KEYS[#KEYS]
-- what the call adds goes to the journal too while a dump reads the shard: site, stream
-- index, due ms, payload, ... (written with the indexes)
local journal_on = redis.call('EXISTS', journal) == 1
local journaled = {}
local now = nil -- Redis TIME, read once, when something needs it
local total_added = 0
-- The shard's indexes are written once per call, not once per site (a ZADD or SADD costs
-- about as much per site as reading its policy): members collected here, see index_all.
local marks = { {}, {} } -- per task type: score, site, score, site, ...
local new_site_marks = { {}, {} } -- per task type: new sites with work due now, for the fresh list
local registered = {}
-- New sites' writes, made for all of them at once (write_new): seen key, value, ... (no
-- revisit TTL) and site, packed inbox, ...
local new_seen, new_inbox = {}, {}
local done_sites = {} -- sites of the call enqueued so far
local NO_POLICY = {}

-- Which sites of the call are not in the registry yet (the order of ARGV). If a filter key
-- of one of them exists anyway (something else wrote it), none is taken as new: the
-- general path then reads what is there, and refuses a key of the wrong type.
local function unregistered()
  local names = {}
  local i = FIRST_SITE_ARG
  while i <= #ARGV do
    names[#names + 1] = ARGV[i]
    i = i + 2 + STRIDE * tonumber(ARGV[i + 1])
  end
  local out, filter_keys = {}, {}
  for j = 1, #names, 1000 do
    local got = redis.call('SMISMEMBER', sites_ix, unpack(names, j, math.min(j + 999, #names)))
    for q = 1, #got do
      local n = j + q - 1
      out[n] = got[q] == 0
      if out[n] then
        local k = FIRST_SITE_KEY + (n - 1) * PER_SITE + AT_FILTERS
        for f = 0, 2 * n_filters - 1 do
          filter_keys[#filter_keys + 1] = KEYS[k + f]
        end
      end
    end
  end
  for j = 1, #filter_keys, 1000 do
    if redis.call('EXISTS', unpack(filter_keys, j, math.min(j + 999, #filter_keys))) > 0 then
      return {}
    end
  end
  return out
end

-- Note an added request for the journal (call it only while a dump reads the shard:
-- journal_on).
local function journal_add(site, idx, due, payload)
  local j = journaled
  j[#j + 1] = site
  j[#j + 1] = idx
  j[#j + 1] = due
  j[#j + 1] = payload
end

local function write_new()
  for j = 1, #new_seen, 1000 do
    redis.call('MSET', unpack(new_seen, j, math.min(j + 999, #new_seen)))
  end
  for j = 1, #new_inbox, 1000 do
    redis.call('HSET', inbox, unpack(new_inbox, j, math.min(j + 999, #new_inbox)))
  end
  new_seen, new_inbox = {}, {}
end

-- A new site's exact set of 8-byte prefixes: written with the call's others (write_new),
-- or now when it must carry the revisit TTL.
local function write_exact(seen, prefixes)
  if ttl > 0 then
    redis.call('SET', seen, table.concat(prefixes), 'EX', ttl)
  else
    new_seen[#new_seen + 1] = seen
    new_seen[#new_seen + 1] = table.concat(prefixes)
  end
end

-- dedupe for a new site: its filter is empty, so only repeats within the call are
-- duplicates. Nil when the set would be too big for an exact set (dedupe then makes the
-- Bloom filter).
local function dedupe_new(seen, fps)
  local unseen, new, batch = {}, {}, {}
  for i = 1, #fps do
    local p = string.sub(fps[i], 1, 8)
    if batch[p] then
      unseen[i] = 0
    else
      unseen[i] = 1
      batch[p] = true
      new[#new + 1] = p
    end
  end
  if #new > EXACT_MAX then
    return nil
  end
  if #new > 0 then
    write_exact(seen, new)
  end
  return unseen
end

-- The stream index (1..STREAM_COUNT) a request's stream code names, or nil: a band code
-- (SITE_TASK + band) takes the site's task type.
local function stream_index(code, site_task)
  local idx = tonumber(code)
  if idx and idx > SITE_TASK then
    idx = idx - SITE_TASK + (site_task == 'browser' and BANDS or 0)
  end
  if idx and idx % 1 == 0 and idx >= 1 and idx <= STREAM_COUNT then
    return idx
  end
  return nil
end

-- mark_ready (lib/index.lua) for many sites: a site got work of task type t, ready from `at` at the latest
local function mark_later(t, site, at)
  local m = marks[t]
  m[#m + 1] = at
  m[#m + 1] = site
end

-- Write what mark_later and the site registry collected (also before an error reply: the
-- sites enqueued before it keep their work, which must be indexed). ZADD LT applies its
-- pairs in order, as the calls one by one would.
local function index_all()
  write_new()
  for t = 1, 2 do
    local m = marks[t]
    for j = 1, #m, 1000 do
      redis.call('ZADD', ready[t], 'LT', unpack(m, j, math.min(j + 999, #m)))
    end
    local f = new_site_marks[t]
    for j = 1, #f, 1000 do
      redis.call('RPUSH', new_site_lists[t], unpack(f, j, math.min(j + 999, #f)))
    end
  end
  for j = 1, #registered, 500 do
    redis.call('SADD', sites_ix, unpack(registered, j, math.min(j + 499, #registered)))
  end
  if journal_on then
    local j = journaled
    for q = 1, #j, 4 do
      redis.call('XADD', journal, '*', 's', j[q], 'q', j[q + 1], 't', j[q + 2], 'r', j[q + 3])
    end
    journaled = {}
  end
end

-- load: which requests of a site's part the ledger holds already (by ARGV index), and
-- after the part is done, putting in the lines of the others
local function ledger_taken(first, last)
  local get, at = {}, {}
  for i = first, last, STRIDE do
    if ARGV[i + 4] ~= '' then
      get[#get + 1] = 'GET'
      get[#get + 1] = 'u1'
      get[#get + 1] = ARGV[i + 4]
      at[#at + 1] = i
    end
  end
  local taken = {}
  if #at > 0 then
    local bits = redis.call('BITFIELD', ledger, unpack(get))
    for q = 1, #at do
      if bits[q] == 1 then
        taken[at[q]] = true
      end
    end
  end
  return taken
end

local function ledger_mark(first, last, taken)
  local set = {}
  for i = first, last, STRIDE do
    if ARGV[i + 4] ~= '' and not taken[i] then
      set[#set + 1] = 'SET'
      set[#set + 1] = 'u1'
      set[#set + 1] = ARGV[i + 4]
      set[#set + 1] = 1
    end
  end
  if #set > 0 then
    redis.call('BITFIELD', ledger, unpack(set))
  end
end

local function enqueue_site(k, site, filters, first, last, new_site)
  local K = { KEYS[k], KEYS[k + 1], KEYS[k + 2] }
  local streams = { KEYS[k + 3], KEYS[k + 4], KEYS[k + 5], KEYS[k + 6], KEYS[k + 7], KEYS[k + 8] }
  -- the site's policy fields enqueue reads: task_type (routes site-task codes), max_pages
  local pol = new_site and NO_POLICY or redis.call('HMGET', K[3], 'task_type', 'max_pages', 'ready_at')
  local site_task = pol[1] or ARGV[7]
  -- load: the requests the ledger holds already, and which ones are no request to queue
  -- (a dead letter or a fingerprint only: kind 'd' or 's')
  local taken, kind -- load only (read behind `load_keys and`)
  if load_keys then
    kind = {}
    taken = ledger_taken(first, last)
    for i = first, last, STRIDE do
      local code = tonumber(ARGV[i + 1]) or 0
      if code == SEEN_CODE then
        kind[i] = 's'
      elseif code > DEAD_CODE and code <= DEAD_CODE + STREAM_COUNT then
        kind[i] = 'd'
      end
    end
  end
  local fps, fp_at = {}, {}
  for i = first, last, STRIDE do
    if ARGV[i] ~= '' and not (load_keys and taken[i]) then
      fps[#fps + 1] = ARGV[i]
      fp_at[i] = #fps
    end
  end

  -- per fingerprint: 1 unseen, 0 a duplicate. small_new: a new site whose filter is a new
  -- exact set (so it has no stream yet either, and its requests go to the inbox)
  local unseen = new_site and dedupe_new(filters[1][1], fps)
  local small_new = unseen and true or false
  if not unseen then
    unseen = dedupe(mode, filters, fps, err, cap, expansion)
  end
  if unseen.err then
    return unseen
  end
  if ttl > 0 and #fps > 0 and not small_new then
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
    local left = max_pages - tonumber(redis.call('HGET', K[2], 'pages') or '0')
    for i = first, last, STRIDE do
      local n = fp_at[i]
      if n and unseen[n] ~= 0 and not (load_keys and kind[i]) then
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

  local added, dups, delayed, dead = 0, 0, 0, 0
  local flags = {}
  local due_now = {}
  local due_d = load_keys and {} -- load: earlier failed deliveries, by due_now pair
  local with_d = false
  for i = first, last, STRIDE do
    local n = fp_at[i]
    if load_keys and taken[i] then
      flags[#flags + 1] = 'l'
    elseif load_keys and kind[i] == 's' then
      flags[#flags + 1] = (n and unseen[n] ~= 0) and 's' or '0'
    elseif load_keys and kind[i] == 'd' then
      -- a dead letter stays one, seen or not (its fingerprint is recorded above)
      local x = cmsgpack.unpack(ARGV[i + 5])
      local origin = x[6]
      if not origin or origin == '' then
        origin = streams[tonumber(ARGV[i + 1]) - DEAD_CODE]
      end
      redis.call('XADD', KEYS[k + AT_FILTERS + 2 * n_filters], '*', 'r', ARGV[i + 3], 'reason', tostring(x[1]),
        'stream', origin, 'id', tostring(x[5]), 'deliveries', tostring(x[2]), 'node', tostring(x[3]),
        'ts', tostring(x[4]))
      dead = dead + 1
      added = added + 1
      flags[#flags + 1] = '1'
    elseif n and unseen[n] == 0 and not keep_seen then
      dups = dups + 1
      flags[#flags + 1] = '0'
    elseif over[i] then
      flags[#flags + 1] = 'c'
    else
      local idx, delay, payload = stream_index(ARGV[i + 1], site_task), tonumber(ARGV[i + 2]), ARGV[i + 3]
      if not idx then
        return redis.error_reply('STREAMSARG stream index ' .. tostring(ARGV[i + 1]) .. ' out of range')
      end
      if delay and delay > 0 then
        local seq = redis.call('HINCRBY', K[2], 'delay_seq', 1)
        now = now or now_ms()
        redis.call('ZADD', K[1], now + delay, idx .. ':' .. seq .. ':' .. payload)
        if journal_on then
          journal_add(site, idx, now + delay, payload)
        end
        delayed = delayed + 1
        for t = 1, 2 do
          mark_later(t, site, now + delay)
        end
      else
        due_now[#due_now + 1] = idx
        due_now[#due_now + 1] = payload
        if load_keys then
          local d = tonumber(ARGV[i + 5]) or 0
          due_d[#due_now / 2] = d
          with_d = with_d or d > 0
        end
        if journal_on then
          journal_add(site, idx, 0, payload)
        end
      end
      added = added + 1
      flags[#flags + 1] = '1'
    end
  end

  -- requests counted in the site's enqueued now; those left in an uncounted inbox list
  -- are counted when they move into its streams (lib/inbox.lua: UNCOUNTED)
  local counted_now = added
  if #due_now > 0 then
    -- a site with no stream keeps a few requests in the shard's inbox (lib/inbox.lua: INBOX_MAX)
    local list, counted = false, false
    if small_new and not with_d then
      list = #due_now <= 2 * INBOX_MAX and {}
    elseif redis.call('EXISTS', unpack(streams)) == 0 then
      list, counted = inbox_list(inbox, site)
      if with_d or #list + #due_now > 2 * INBOX_MAX then
        inbox_flush(inbox, site, streams, group, K[2], list, counted)
        list = false
      end
    end
    if list then
      for _, v in ipairs(due_now) do
        list[#list + 1] = v
      end
      local packed = cmsgpack.pack(list)
      if not counted then
        packed = packed .. UNCOUNTED
        counted_now = counted_now - #due_now / 2
      end
      if small_new then
        new_inbox[#new_inbox + 1] = site
        new_inbox[#new_inbox + 1] = packed
      else
        redis.call('HSET', inbox, site, packed)
      end
    else
      local made = {}
      for j = 1, #due_now, 2 do
        local stream = streams[due_now[j]]
        if not made[stream] then
          ensure_group(stream, group)
          made[stream] = true
        end
        local d = due_d and due_d[(j + 1) / 2]
        if d and d > 0 then
          redis.call('XADD', stream, '*', 'r', due_now[j + 1], 'd', d)
        else
          redis.call('XADD', stream, '*', 'r', due_now[j + 1])
        end
      end
    end
    now = now or now_ms()
    local at = math.max(now, tonumber(pol[3]) or 0)
    local typed = {}
    for j = 1, #due_now, 2 do
      typed[task_of(due_now[j])] = true
    end
    for t = 1, 2 do
      if typed[t] then
        mark_later(t, site, at)
      end
    end
  end
  if counted_now > 0 then
    redis.call('HINCRBY', K[2], 'enqueued', counted_now)
  end
  if dups > 0 then
    redis.call('HINCRBY', K[2], 'duplicates', dups)
  end
  if delayed > 0 then
    redis.call('HINCRBY', K[2], 'delayed_in', delayed)
  end
  if dead > 0 then
    redis.call('HINCRBY', K[2], 'dead', dead)
  end
  if pages_in > 0 then
    redis.call('HINCRBY', K[2], 'pages', pages_in)
  end
  if over_cap > 0 then
    redis.call('HINCRBY', K[2], 'over_cap', over_cap)
  end
  if load_keys then
    ledger_mark(first, last, taken)
  end
  if new_site then
    registered[#registered + 1] = site
  end
  total_added = total_added + added
  return { added, dups, delayed, table.concat(flags), over_cap }
end

-- A new site in the common case, in one pass: no policy, an empty filter, every request
-- due now and few enough for the inbox. Its reply, or nil (nothing written) when the
-- general path must take it.
local function enqueue_new(k, site, first, last)
  if (last - first + 1) / 4 > INBOX_MAX then
    return nil
  end
  -- one pass, deduping as it goes (dedupe_new's rule: only repeats within the call);
  -- nothing is written before the last request has been found fit
  local list, flags, prefixes, batch = {}, {}, {}, {}
  local dups, typed = 0, {}
  for i = first, last, 4 do
    local idx = tonumber(ARGV[i + 2]) == 0 and stream_index(ARGV[i + 1], ARGV[7])
    if not idx then
      return nil -- a delay, or a code the general path names
    end
    local p = ARGV[i] ~= '' and string.sub(ARGV[i], 1, 8)
    if p and batch[p] then
      dups = dups + 1
      flags[#flags + 1] = '0'
    else
      if p then
        batch[p] = true
        prefixes[#prefixes + 1] = p
      end
      list[#list + 1] = idx
      list[#list + 1] = ARGV[i + 3]
      if journal_on then
        journal_add(site, idx, 0, ARGV[i + 3])
      end
      flags[#flags + 1] = '1'
      typed[task_of(idx)] = true
    end
  end
  if #prefixes > 0 then
    write_exact(KEYS[k + AT_FILTERS], prefixes)
  end
  local added = #list / 2
  if added > 0 then
    new_inbox[#new_inbox + 1] = site
    new_inbox[#new_inbox + 1] = cmsgpack.pack(list) .. UNCOUNTED
    for t = 1, 2 do
      if typed[t] then
        local f = new_site_marks[t]
        f[#f + 1] = site
      end
    end
  end
  if dups > 0 then
    redis.call('HINCRBY', KEYS[k + AT_STATS], 'duplicates', dups)
  end
  registered[#registered + 1] = site
  total_added = total_added + added
  return { added, dups, 0, table.concat(flags), 0 }
end

local replies = {}
local unregistered_sites = unregistered()
local k, i = FIRST_SITE_KEY, FIRST_SITE_ARG
while i <= #ARGV do
  local n, site = tonumber(ARGV[i + 1]), ARGV[i]
  -- a site that comes again in the call (a long list split in parts) reads what its first
  -- part wrote
  if done_sites[site] then
    write_new()
  end
  local new_site = unregistered_sites[#replies + 1] and not done_sites[site]
  done_sites[site] = true
  local reply = new_site and not load_keys and enqueue_new(k, site, i + 2, i + 1 + STRIDE * n)
  if not reply and seed_keys then
    reply = {}
  elseif not reply then
    local filters = {}
    for f = 0, n_filters - 1 do
      filters[#filters + 1] = { KEYS[k + 9 + 2 * f], KEYS[k + 10 + 2 * f] }
    end
    reply = enqueue_site(k, site, filters, i + 2, i + 1 + STRIDE * n, new_site)
  end
  if reply.err then
    index_all()
    return reply
  end
  replies[#replies + 1] = reply
  k = k + PER_SITE
  i = i + 2 + STRIDE * n
end
index_all()
if total_added > 0 then
  redis.call('HINCRBY', KEYS[4], 'enqueued', total_added)
end
return replies
