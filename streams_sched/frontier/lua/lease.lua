-- lease.lua: lease requests of SEVERAL sites of one shard for one consumer, and
-- name the shard's next ready sites, in one call.
-- For each site: moves its inbox requests and its due delayed requests into its
-- streams, takes a token per request from the site's global token bucket (time from
-- Redis, shared by all workers), then reads each priority band in proportion to the
-- band weights (lib/bands.lua: low never starves),
-- and puts the site back in the shard's indexes as it is left (lib/index.lua: reindex).
-- Entries that failed before (requeued after a lease expired) are handed out one at a
-- time over the whole call (ARGV[7]), so a poison request cannot take innocent ones
-- down with it.
-- Then it names up to ARGV[14] sites per task type the worker leases whose time has
-- come in the shard's ready index, for the worker to lease in its next call: a run of
-- them at a random place (ARGV[15]) among the oldest 8 x ARGV[14], so workers that
-- call at the same moment are mostly named different sites, while the oldest sites
-- still come first. Before it names them it moves new sites from the front of the
-- shard's fresh list into the ready index, scored now: enough that 8 x ARGV[14] sites are
-- due, and never fewer than a quarter of ARGV[14], so new sites go on being served while
-- sites with a long backlog fill the oldest places.
--
-- include: codes, time, rate, streams, delayed, inbox, index, bands
--
-- KEYS[1]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[2]      ready:browser  ZSET of the shard's sites with browser work
-- KEYS[3]      leased         ZSET of the shard's sites with leased entries
-- KEYS[4]      inbox          HASH of the shard's small sites' queued requests
-- KEYS[5]      fresh:http     LIST of the shard's new sites with http work (enqueue.lua)
-- KEYS[6]      fresh:browser  LIST of the shard's new sites with browser work
-- KEYS[7]      halt           STRING set by `streams-sched move` (keys.py): while it exists the
--                             call leases nothing, every site answering as paused, names no
--                             site, and its value comes last in the reply
-- KEYS[8..]    per site, 10 keys:
--              delayed        ZSET of waiting requests
--              dlq            dead-letter stream (for malformed delayed members)
--              stats          HASH of counters and band-rotation state
--              policy         HASH: paused, rate (req/s, 0 = none), burst, weight, max_browser,
--                             and the bucket state: tokens, tokens_ts
--              streams (6)    http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group
-- ARGV[2]      consumer (node id)
-- ARGV[3..5]   band weights: high, default, low
-- ARGV[6]      max delayed entries to promote per site
-- ARGV[7]      max entries with earlier failed deliveries (field d > 0) to hand out in this
--              call; extra ones go back to the end of their stream, so one worker never
--              holds two requests that may have crashed a worker before
-- ARGV[8..12]  the crawl's defaults for fields the site's policy does not set:
--              rate, burst, paused ('1'/'0'), weight, max_browser ('' = none)
-- ARGV[13]     politeness flags: 'a' adaptive back-off on (STREAMS_ADAPTIVE), 'r' robots.txt
--              obeyed (ROBOTSTXT_OBEY); '' neither. They decide the site's effective rate
--              (lib/rate.lua). With 'r' and no policy rate, a site whose robots.txt nobody
--              has read yet gets one probe request (robots_probe) every 10 s until a worker
--              reports its Crawl-delay.
-- ARGV[14]     ready sites to name per task type (0: none)
-- ARGV[15]     a random whole number (where the named run starts)
-- ARGV[16]     task types this worker leases: 'h' http, 'b' browser, 'hb' both
-- ARGV[17]     ms a paused site waits before it is looked at again
-- ARGV[18]     max entries this call leases in all; a site reached when it is spent is
--              not looked at (its reply is empty)
-- ARGV[19..]   per site, 4 values: site name, max entries in all, max http entries,
--              max browser entries
-- Returns {per site: {} if not looked at, else {backlog_http, backlog_browser, pending, delayed, ms until the next
--          delayed request is due (-1 none), wait_ms (0 ok, >0 rate-limited for that long,
--          -1 paused), entries put back because of ARGV[7], the site's weight (string),
--          the site's max_browser (-1 none), the site's effective rate (string, '0' none),
--          the site's policy revisit ('' none: see politeness/policy.py),
--          the site's freshness multiplier (rv_mu, seconds; '' none: see ack.lua),
--          then per entry: stream index, id, payload (false if missing), prior deliveries},
--          then {named ready sites}, then ms until the shard's next not-yet-ready site
--          is due (-1 none), then the halt's value ('' none)}

local group, consumer = ARGV[1], ARGV[2]
local weights = { tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]) }
local promote_limit = tonumber(ARGV[6])
-- the values of a site's reply before its entries (scripts/lease.py: _HEAD)
local REPLY_HEAD = 12
local suspects_left = tonumber(ARGV[7]) or 1
local ready = { KEYS[1], KEYS[2] }
local leased_ix, inbox = KEYS[3], KEYS[4]
local fresh_ix = { KEYS[5], KEYS[6] }
local paused_wait = tonumber(ARGV[17])
-- Redis TIME, read once per call
local now = now_ms()
local function clock()
  return now
end

local function lease_site(k, site, total, max_http, max_browser)
  local want = { max_http, max_browser }
  local streams = { KEYS[k + 4], KEYS[k + 5], KEYS[k + 6], KEYS[k + 7], KEYS[k + 8], KEYS[k + 9] }
  local K = { KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3] }
  -- a site with requests in the inbox has no stream (lib/inbox.lua: inbox_flush): what it
  -- flushes is all its backlog, so its streams need not be read
  local known = inbox_flush(inbox, site, streams, group, K[3])
  local delayed = redis.call('ZCARD', K[1])
  local promoted = false
  if delayed > 0 then
    -- a site whose work is all delayed (tracked pages between visits, retries waiting)
    -- has no stream: then its backlog is what the promotion moves, and its six streams
    -- need not be read
    local bare = not known and redis.call('EXISTS', unpack(streams)) == 0
    local moved, left, per_stream = promote_due(K[1], K[2], K[3], streams, group, clock(), promote_limit, bare)
    delayed = delayed - left
    if bare then
      promoted = per_stream
    elseif moved > 0 then
      known = false -- the streams now hold more than the inbox had
    end
  end

  -- policy_fields' fields (lib/rate.lua) and the lease's, in one HMGET, into a table built
  -- at its size: filled field by field it would be rehashed four times, for every site
  local g = redis.call('HMGET', K[4], 'paused', 'rate', 'burst', 'robots_delay', 'a_rate', 'a_until',
    'tokens', 'tokens_ts', 'weight', 'max_browser', 'robots_probe', 'revisit', 'rv_mu')
  local p = { paused = g[1], rate = g[2], burst = g[3], robots_delay = g[4], a_rate = g[5], a_until = g[6],
    tokens = g[7], tokens_ts = g[8], weight = g[9], max_browser = g[10], robots_probe = g[11], revisit = g[12],
    rv_mu = g[13] }
  local site_weight = p.weight or ARGV[11]
  local max_browser = tonumber(p.max_browser) or tonumber(ARGV[12]) or -1
  -- politeness: the policy or robots.txt rate, the adaptive back-off, a Retry-After pause
  -- (lib/rate.lua); an operator's pause
  local flags = ARGV[13] or ''
  local rate, burst_setting, why, held_until, base = effective_rate(p, ARGV[8], ARGV[9], ARGV[10], flags, now)
  local wait_ms = 0
  local budget = total
  local tokens, burst
  local probe = false
  if base <= 0 and tonumber(p.robots_delay) == nil and string.find(flags, 'r', 1, true) then
    -- nobody has read the site's robots.txt yet: one probe request every 10 s until a
    -- worker reports its Crawl-delay
    local last = tonumber(p.robots_probe)
    if last and clock() - last < 10000 then
      held_until = math.max(held_until, now + 200)
    else
      probe = true
      budget = math.min(budget, 1)
    end
  end
  if why == 'paused' then
    budget = 0
    wait_ms = -1
  elseif held_until > clock() then
    budget = 0
    wait_ms = held_until - now
  elseif rate > 0 then
    burst = math.max(burst_setting or rate, 1)
    tokens = tonumber(p.tokens)
    local ts = tonumber(p.tokens_ts)
    if tokens == nil or ts == nil then
      tokens = burst
    else
      tokens = math.min(burst, tokens + math.max(clock() - ts, 0) * rate / 1000)
    end
    budget = math.min(budget, math.floor(tokens))
  end

  local backlog = { 0, 0 }
  local per_band = { { 0, 0, 0 }, { 0, 0, 0 } } -- per task type, per band (BANDS = 3)
  local pending = 0
  -- the reply: REPLY_HEAD values (set at the end), then the entries, in one table built at
  -- the head's size (a table grown entry by entry is reallocated at every power of two)
  local out = { 0, 0, 0, 0, 0, 0, 0, '', 0, '', '', '' }
  local leased = 0
  local deferred = 0
  if promoted then
    known = promoted
  elseif delayed > 0 then
    known = false -- delayed requests left: read the streams as they are
  end
  for t = 1, 2 do
    for b = 1, BANDS do
      -- both task types, even one this worker does not lease: the indexes need them
      local n, p = 0, 0
      local s = (t - 1) * BANDS + b -- stream_of(t, b), inline: six times a site
      if known then
        n = known[s] or 0
      else
        n, p = backlog_of(streams[s], group)
      end
      per_band[t][b] = n
      pending = pending + p
      backlog[t] = backlog[t] + n
    end
  end
  -- browser first: its capacity per node is the scarcer one
  for t = 2, 1, -1 do
    local bl = per_band[t]
    local n = math.min(want[t], budget - leased)
    if n > 0 and backlog[t] > 0 then
      local take = rotate_bands(K[3], t, weights, bl, n)
      for b = 1, BANDS do
        if take[b] > 0 then
          local s = stream_of(t, b)
          local res = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', take[b],
            'STREAMS', streams[s], '>')
          if res then
            for _, e in ipairs(res[1][2]) do
              local payload, d = entry_fields(e[2])
              if d > 0 and payload then
                suspects_left = suspects_left - 1
              end
              if suspects_left < 0 and d > 0 and payload then
                -- not now: back to the end of the stream, delivery count unchanged
                redis.call('XADD', streams[s], '*', 'r', payload, 'd', d)
                redis.call('XACK', streams[s], group, e[1])
                redis.call('XDEL', streams[s], e[1])
                deferred = deferred + 1
              else
                out[#out + 1] = s
                out[#out + 1] = e[1]
                out[#out + 1] = payload
                out[#out + 1] = d
                leased = leased + 1
                backlog[t] = backlog[t] - 1
                pending = pending + 1
              end
            end
          end
        end
      end
    end
  end

  if tokens ~= nil then
    tokens = tokens - leased
    redis.call('HSET', K[4], 'tokens', tostring(tokens), 'tokens_ts', clock())
    if leased < total and (backlog[1] + backlog[2]) > 0 and tokens < 1 then
      wait_ms = math.ceil((1 - tokens) * 1000 / rate)
    end
  end
  if leased > 0 then
    redis.call('HINCRBY', K[3], 'leased', leased)
    if probe then
      -- the robots.txt probe: the bucket starts empty at this request, so the first
      -- request after the Crawl-delay is known comes a full delay after it
      local t = clock()
      redis.call('HSET', K[4], 'robots_probe', t, 'tokens', '0', 'tokens_ts', t)
    end
  end

  local next_due_at, next_due = -1, -1
  if delayed > 0 then
    next_due_at = next_due_of(K[1])
    next_due = math.max(0, next_due_at - now)
  end
  -- back in the indexes: from now while it has backlog, from when its bucket or pause
  -- lets it go on otherwise (kept in the policy, so an enqueue does not bring it forward)
  local at = now
  if wait_ms > 0 then
    at = now + wait_ms
  elseif wait_ms == -1 then
    at = now + paused_wait
  end
  if at > now then
    redis.call('HSET', K[4], 'ready_at', at)
  end
  reindex(ready, leased_ix, site, backlog, pending, next_due_at, at, now)
  out[1], out[2], out[3], out[4], out[5], out[6] = backlog[1], backlog[2], pending, delayed, next_due, wait_ms
  out[7], out[8], out[9], out[10], out[11] = deferred, tostring(site_weight or '1'), max_browser, tostring(rate),
    p.revisit or ''
  out[12] = p.rv_mu or ''
  return out
end

local replies = {}
local halt = redis.call('GET', KEYS[7])
if halt then
  -- a move stops leasing: every site answers as a paused one, to be asked again later
  for _ = 19, #ARGV, 4 do
    replies[#replies + 1] = { 0, 0, 0, 0, -1, -1, 0, '1', -1, '0', '', '' }
  end
  replies[#replies + 1] = {}
  replies[#replies + 1] = paused_wait
  replies[#replies + 1] = halt
  return replies
end
local k = 8
local budget_left = tonumber(ARGV[18])
for i = 19, #ARGV, 4 do
  local total = math.min(tonumber(ARGV[i + 1]), budget_left)
  if total > 0 then
    local reply = lease_site(k, ARGV[i], total, math.min(tonumber(ARGV[i + 2]), total),
      math.min(tonumber(ARGV[i + 3]), total))
    budget_left = budget_left - (#reply - REPLY_HEAD) / 4
    replies[#replies + 1] = reply
  else
    replies[#replies + 1] = {}
  end
  k = k + 10
end

-- the shard's next ready sites, for this worker's next call
local named, seen = {}, {}
local wanted = tonumber(ARGV[14])
local spread = tonumber(ARGV[15])
local next_in = -1
for t, letter in ipairs({ 'h', 'b' }) do
  if string.find(ARGV[16], letter, 1, true) then
    local count = wanted > 0 and redis.call('ZCOUNT', ready[t], '-inf', now) or 0
    if wanted > 0 then
      -- A listed site whose inbox field is gone was leased or grew a stream since: whatever
      -- work it has left put it in the ready index then. NX keeps the score of one that is
      -- in the index already (it got more work since).
      local moved = redis.call('LPOP', fresh_ix[t], math.max(8 * wanted - count, math.ceil(wanted / 4)))
      if moved then
        local queued = redis.call('HMGET', inbox, unpack(moved))
        local pairs_ = {}
        for j, site in ipairs(moved) do
          if queued[j] then
            pairs_[#pairs_ + 1] = now
            pairs_[#pairs_ + 1] = site
          end
        end
        if #pairs_ > 0 then
          count = count + redis.call('ZADD', ready[t], 'NX', unpack(pairs_))
        end
      end
    end
    if count > 0 then
      local start = spread % (math.max(0, math.min(count, 8 * wanted) - wanted) + 1)
      for _, site in ipairs(redis.call('ZRANGE', ready[t], start, start + wanted - 1)) do
        if not seen[site] then
          seen[site] = true
          named[#named + 1] = site
        end
      end
    end
    local first = redis.call('ZRANGEBYSCORE', ready[t], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then
      local d = tonumber(first[2]) - now
      if next_in < 0 or d < next_in then
        next_in = d
      end
    end
  end
end
replies[#replies + 1] = named
replies[#replies + 1] = next_in
replies[#replies + 1] = ''
return replies
