-- status.lua: a snapshot of ONE site, read in one atomic call. Read-only: it is
-- run with EVALSHA_RO / EVAL_RO, so a read-only ACL user (the monitor) can run it.
--
-- include: codes, time, rate, streams, inbox
--
-- KEYS[1]      delayed   ZSET of waiting requests
-- KEYS[2]      dlq       dead-letter stream
-- KEYS[3]      stats     HASH of counters
-- KEYS[4]      policy    HASH of the site's policy
-- KEYS[5..10]  streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[11]     inbox     HASH of the shard's small sites' queued requests (lib/index.lua)
-- ARGV[1]      consumer group
-- ARGV[2]      the site's name (its field in the inbox)
-- ARGV[3..7]   the crawl's defaults for fields the site's policy does not set, as lease.lua's
--              ARGV[8..12]: rate, burst, paused ('1'/'0'), weight, max_browser ('' = none)
-- Returns {now_ms, then per stream: backlog, pending, idle ms of the oldest pending
--          entry (-1 none), then delayed, next due ms (-1 none), dead letters,
--          stats as a flat field/value list, policy as a flat field/value list, then the
--          site's effective rate (lib/rate.lua; string, '0' unlimited or paused), why,
--          and until when a Retry-After pauses it (ms, 0 none), then the delayed requests
--          past their due time (overdue) and the first of them ('' none), whose payload
--          tells a tracked page's interval}
--
-- Overdue requests cost one ZCOUNT, and the oldest a ZRANGE of one member: what a read
-- costs does not grow with the site's waiting pages.
--
-- The rate is the one workers that back off and obey robots.txt apply: a site's back-off,
-- Retry-After and Crawl-delay are written only by workers that do.

local group = ARGV[1]
local reply = { now_ms() }
-- requests still in the inbox count as backlog of their streams
local waiting = {}
local list, counted = inbox_list(KEYS[11], ARGV[2])
for i = 1, #list, 2 do
  local code = tonumber(list[i])
  waiting[code] = (waiting[code] or 0) + 1
end
for s = 5, 4 + STREAM_COUNT do
  local backlog, pending = backlog_of(KEYS[s], group, true)
  local oldest = -1
  if pending > 0 then
    local p = redis.call('XPENDING', KEYS[s], group, '-', '+', 1)
    if p[1] then
      oldest = tonumber(p[1][3])
    end
  end
  reply[#reply + 1] = backlog + (waiting[s - 4] or 0)
  reply[#reply + 1] = pending
  reply[#reply + 1] = oldest
end
local delayed = redis.call('ZCARD', KEYS[1])
local next_due = -1
if delayed > 0 then
  next_due = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
end
reply[#reply + 1] = delayed
reply[#reply + 1] = next_due
reply[#reply + 1] = redis.call('XLEN', KEYS[2])
local stats = redis.call('HGETALL', KEYS[3])
if not counted and #list > 0 then
  -- inbox requests count as enqueued from the start (lib/inbox.lua: UNCOUNTED)
  local at = nil
  for i = 1, #stats, 2 do
    if stats[i] == 'enqueued' then
      at = i + 1
    end
  end
  if at then
    stats[at] = tostring(tonumber(stats[at]) + #list / 2)
  else
    stats[#stats + 1] = 'enqueued'
    stats[#stats + 1] = tostring(#list / 2)
  end
end
reply[#reply + 1] = stats
local policy = redis.call('HGETALL', KEYS[4])
reply[#reply + 1] = policy
local p = {}
for i = 1, #policy, 2 do
  p[policy[i]] = policy[i + 1]
end
local rate, _, why, until_ms = effective_rate(p, ARGV[3], ARGV[4], ARGV[5], 'ar', reply[1])
if why == 'paused' then
  rate, until_ms = 0, 0
end
reply[#reply + 1] = tostring(rate)
reply[#reply + 1] = why
reply[#reply + 1] = until_ms
local overdue, oldest = 0, ''
if next_due >= 0 and next_due <= reply[1] then
  overdue = redis.call('ZCOUNT', KEYS[1], '-inf', reply[1])
  oldest = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
end
reply[#reply + 1] = overdue
reply[#reply + 1] = oldest
return reply
