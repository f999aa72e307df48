-- lease.lua: lease up to N requests of ONE site for one consumer.
-- First moves due delayed requests into their streams, then takes a token per
-- request from the site's global token bucket (time from Redis, shared by all
-- workers), then reads each priority band in proportion to the band weights
-- (smooth weighted round robin, state kept in stats, so low never starves).
-- Entries that failed before (requeued after a lease expired) are handed out one
-- at a time (ARGV[10]), so a poison request cannot take innocent ones down with it.
--
-- KEYS[1]      delayed   ZSET of waiting requests
-- KEYS[2]      dlq       dead-letter stream (for malformed delayed members)
-- KEYS[3]      stats     HASH of counters and band-rotation state
-- KEYS[4]      policy    HASH: paused, rate (req/s, 0 = none), burst, weight, max_browser,
--                        and the bucket state: tokens, tokens_ts
-- KEYS[5..10]  streams   http:high http:default http:low browser:high browser:default browser:low
-- ARGV[1]      consumer group
-- ARGV[2]      consumer (node id)
-- ARGV[3]      max entries to lease in all
-- ARGV[4]      max http entries (0 if this worker does not do http)
-- ARGV[5]      max browser entries (0 without the browser capability or room)
-- ARGV[6..8]   band weights: high, default, low
-- ARGV[9]      max delayed entries to promote
-- ARGV[10]     max entries with earlier failed deliveries (field d > 0) to hand out;
--              extra ones go back to the end of their stream, so one worker never
--              holds two requests that may have crashed a worker before
-- ARGV[11..15] the crawl's defaults for fields the site's policy does not set:
--              rate, burst, paused ('1'/'0'), weight, max_browser ('' = none)
-- ARGV[16]     politeness flags: 'a' adaptive back-off on (STREAMS_ADAPTIVE), 'r' robots.txt
--              obeyed (ROBOTSTXT_OBEY); '' neither. The effective rate is the policy rate,
--              else 1 / robots Crawl-delay, lowered by the adaptive rate (a_rate); a
--              Retry-After pause (a_until, ms) holds the site (see feedback.lua). With 'r' and no
--              policy rate, a site whose robots.txt nobody has read yet gets one probe request
--              (robots_probe) every 10 s until a worker reports its Crawl-delay.
-- Returns {backlog_http, backlog_browser, pending (both 0 for a task type asked for 0), delayed, ms until the next delayed
--          request is due (-1 none),
--          wait_ms (0 ok, >0 rate-limited for that long, -1 paused),
--          entries put back because of ARGV[10], the site's weight (string),
--          the site's max_browser (-1 none), the site's effective rate (string, '0' none),
--          then per entry: stream index, id, payload (false if missing), prior deliveries}

local group, consumer = ARGV[1], ARGV[2]
local want = { tonumber(ARGV[4]), tonumber(ARGV[5]) }
local weights = { tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]) }
local streams = { KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10] }
local suspects_left = tonumber(ARGV[10]) or 1
-- Redis TIME, read only when something needs it (delayed requests, a rate, a pause,
-- robots.txt): a site crawled without limits is leased without it
local now = false
local function clock()
  if not now then
    now = now_ms()
  end
  return now
end

local delayed = redis.call('ZCARD', KEYS[1])
if delayed > 0 then
  promote_due(KEYS[1], KEYS[2], KEYS[3], streams, group, clock(), tonumber(ARGV[9]))
  delayed = redis.call('ZCARD', KEYS[1])
end

local pol = redis.call('HMGET', KEYS[4], 'paused', 'rate', 'burst', 'tokens', 'tokens_ts', 'weight', 'max_browser',
  'robots_delay', 'a_rate', 'a_until', 'robots_probe')
local paused = pol[1] or ARGV[13]
local rate = tonumber(pol[2]) or tonumber(ARGV[11]) or 0
local burst_setting = tonumber(pol[3]) or tonumber(ARGV[12])
local site_weight = pol[6] or ARGV[14]
local max_browser = tonumber(pol[7]) or tonumber(ARGV[15]) or -1
local wait_ms = 0
local budget = tonumber(ARGV[3])
local tokens, burst
-- politeness (issue 11): robots Crawl-delay, adaptive back-off, Retry-After pause
local flags = ARGV[16] or ''
local adaptive, robots_obey = string.find(flags, 'a', 1, true), string.find(flags, 'r', 1, true)
local probe = false
local paused_until = adaptive and tonumber(pol[10]) or 0
if rate <= 0 and robots_obey then
  local delay = tonumber(pol[8])
  if delay and delay > 0 then
    rate = 1 / delay
    burst_setting = 1
  elseif delay == nil then
    local last = tonumber(pol[11])
    if last and clock() - last < 10000 then
      paused_until = math.max(paused_until, now + 200)
    else
      probe = true
      budget = math.min(budget, 1)
    end
  end
end
local a_rate = adaptive and tonumber(pol[9])
if a_rate and (rate <= 0 or a_rate < rate) then
  rate = a_rate
  burst_setting = math.max(1, a_rate / 10)
end
if paused ~= '1' and paused_until > 0 and paused_until > clock() then
  budget = 0
  wait_ms = paused_until - now
elseif paused == '1' then
  budget = 0
  wait_ms = -1
elseif rate > 0 then
  burst = math.max(burst_setting or rate, 1)
  tokens = tonumber(pol[4])
  local ts = tonumber(pol[5])
  if tokens == nil or ts == nil then
    tokens = burst
  else
    tokens = math.min(burst, tokens + math.max(clock() - ts, 0) * rate / 1000)
  end
  budget = math.min(budget, math.floor(tokens))
end

local backlog = { 0, 0 }
local per_band = { {}, {} }
local pending = 0
local out = {}
local leased = 0
local deferred = 0
for t = 1, 2 do
  for b = 1, 3 do
    -- a task type this worker does not lease is not even looked at
    local n, p = 0, 0
    if want[t] > 0 then
      n, p = backlog_of(streams[(t - 1) * BANDS + b], group)
    end
    per_band[t][b] = n
    pending = pending + p
    backlog[t] = backlog[t] + n
  end
end
-- browser first: its capacity per node is the scarcer one
for _, t in ipairs({ 2, 1 }) do
  local bl = per_band[t]
  local n = math.min(want[t], budget - leased)
  if n > 0 and backlog[t] > 0 then
    local state_field = 'swrr' .. t
    local cur = { 0, 0, 0 }
    -- with one band backlogged the rotation state cannot change: not read, not written
    local bands = 0
    for b = 1, 3 do
      if bl[b] > 0 then
        bands = bands + 1
      end
    end
    local saved = bands > 1 and redis.call('HGET', KEYS[3], state_field)
    if saved then
      local i = 1
      for v in string.gmatch(saved, '[^,]+') do
        cur[i] = tonumber(v) or 0
        i = i + 1
      end
    end
    local take = { 0, 0, 0 }
    for _ = 1, n do
      local total, best = 0, nil
      for b = 1, 3 do
        if bl[b] - take[b] > 0 then
          cur[b] = cur[b] + weights[b]
          total = total + weights[b]
          if best == nil or cur[b] > cur[best] then
            best = b
          end
        end
      end
      if best == nil then
        break
      end
      cur[best] = cur[best] - total
      take[best] = take[best] + 1
    end
    if bands < 2 then
      -- unchanged (see above)
    elseif cur[1] == 0 and cur[2] == 0 and cur[3] == 0 then
      redis.call('HDEL', KEYS[3], state_field) -- absent = all zero: a drained site keeps no state
    else
      redis.call('HSET', KEYS[3], state_field, table.concat(cur, ','))
    end
    for b = 1, 3 do
      if take[b] > 0 then
        local s = (t - 1) * BANDS + b
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
  redis.call('HSET', KEYS[4], 'tokens', tostring(tokens), 'tokens_ts', clock())
  if leased < tonumber(ARGV[3]) and (backlog[1] + backlog[2]) > 0 and tokens < 1 then
    wait_ms = math.ceil((1 - tokens) * 1000 / rate)
  end
end
if leased > 0 then
  redis.call('HINCRBY', KEYS[3], 'leased', leased)
  if probe then
    -- the robots.txt probe: the bucket starts empty at this request, so the first
    -- request after the Crawl-delay is known comes a full delay after it
    local t = clock()
    redis.call('HSET', KEYS[4], 'robots_probe', t, 'tokens', '0', 'tokens_ts', t)
  end
end

local next_due = -1
if delayed > 0 then
  next_due = math.max(0, tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]) - clock())
end
local reply = { backlog[1], backlog[2], pending, delayed, next_due, wait_ms, deferred,
  tostring(site_weight or '1'), max_browser, tostring(rate) }
for _, v in ipairs(out) do
  reply[#reply + 1] = v
end
return reply
