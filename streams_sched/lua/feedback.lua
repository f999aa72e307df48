-- feedback.lua: what the workers saw of ONE site's answers, batched, and the site's
-- shared politeness state it moves (AIMD on the site's rate, Retry-After pause,
-- robots.txt Crawl-delay). Time is Redis TIME, so every worker agrees.
--
-- AIMD (additive increase, multiplicative decrease, as TCP congestion control):
--   * a congestion signal (429, 503 or a download timeout) cuts the adaptive rate a_rate,
--     at most once per cooldown (max(1 s, 2 / new rate)), to
--     max(floor, min(rate, decrease * served)) where `served` is the rate of healthy answers
--     over the last second (TCP Westwood: the bandwidth estimate, what the site actually
--     served), or to max(floor, rate * decrease) while nothing was served. `rate` is the
--     current effective one: a_rate, else the policy / robots rate, else, on an unlimited
--     site, the rate it answered at over the last second. So the first 429 of an unlimited
--     site lands near the site's limit in one step instead of ten, and 429s answering
--     requests sent before a cut (the rate is already below decrease * served) cut nothing;
--   * healthy answers raise a_rate by `increase` req/s per second, but only while the site
--     uses most of its rate (observed >= 80% of a_rate: a rate nobody uses proves nothing,
--     RFC 7661); at the policy / robots rate a_rate is dropped (back to that rate), and on a
--     site without one a_rate is dropped after `forget` ms without congestion (unlimited again);
--   * a Retry-After pauses the site until now + its delay (a_until), for every worker.
--
-- KEYS[1]  policy  HASH of the site's policy and shared state:
--                  a_rate, a_cut, a_inc, a_until (ms), robots_delay (s)
-- KEYS[2]  stats   HASH of counters: answers_ok, throttled, timeouts, backoffs, retry_after_pauses
-- KEYS[3]  obs     HASH, the observed window: o_ts, o_n (answers), o_ok (healthy), o_rate,
--                  o_okrate (per s); it expires OBS_TTL_MS after the last report, so a
--                  finished site keeps no politeness state
-- ARGV[1]  healthy answers          ARGV[2] 429 / 503 answers      ARGV[3] download timeouts
-- ARGV[4]  longest Retry-After in ms ('0' none)
-- ARGV[5]  robots.txt Crawl-delay in s, capped ('' not reported, '0' none)
-- ARGV[6]  '1' adaptive back-off on, '0' off (only counts and robots are recorded)
-- ARGV[7]  decrease factor (0 < f < 1)     ARGV[8] increase, req/s per second
-- ARGV[9]  floor, req/s                    ARGV[10] forget after ms
-- ARGV[11] the crawl's default rate ('' none)
-- Returns {a_rate ('' none), a_until ms (0 none), observed rate (string), cut (1/0)}

local ok, thr, tmo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local retry_ms = tonumber(ARGV[4]) or 0
local adaptive = ARGV[6] == '1'
local decrease, increase = tonumber(ARGV[7]), tonumber(ARGV[8])
local floor, forget = tonumber(ARGV[9]), tonumber(ARGV[10])
local now = now_ms()

local OBS_TTL_MS = 3000
local p = redis.call('HMGET', KEYS[1], 'rate', 'robots_delay', 'a_rate', 'a_cut', 'a_inc', 'a_until')
local o = redis.call('HMGET', KEYS[3], 'o_ts', 'o_n', 'o_rate', 'o_ok', 'o_okrate')
local robots = tonumber(p[2])
if ARGV[5] ~= '' then
  robots = tonumber(ARGV[5])
  redis.call('HSET', KEYS[1], 'robots_delay', ARGV[5])
end
-- the rate without back-off: the policy's, else 1 / Crawl-delay, else 0 (unlimited)
local base = tonumber(p[1]) or tonumber(ARGV[11]) or 0
if base <= 0 and robots and robots > 0 then
  base = 1 / robots
end

-- observed answer rate: answers counted over windows of at least one second
local n = ok + thr + tmo
local o_ts, o_n, o_rate = tonumber(o[1]), (tonumber(o[2]) or 0) + n, tonumber(o[3]) or 0
local o_ok, o_okrate = (tonumber(o[4]) or 0) + ok, tonumber(o[5]) or 0
if o_ts == nil then
  o_ts = now
elseif now - o_ts >= 1000 then
  o_rate, o_okrate = o_n * 1000 / (now - o_ts), o_ok * 1000 / (now - o_ts)
  o_ts, o_n, o_ok = now, 0, 0
end
redis.call('HSET', KEYS[3], 'o_ts', o_ts, 'o_n', o_n, 'o_ok', o_ok, 'o_rate', tostring(o_rate),
  'o_okrate', tostring(o_okrate))
redis.call('PEXPIRE', KEYS[3], OBS_TTL_MS)

if ok > 0 then
  redis.call('HINCRBY', KEYS[2], 'answers_ok', ok)
end
if thr > 0 then
  redis.call('HINCRBY', KEYS[2], 'throttled', thr)
end
if tmo > 0 then
  redis.call('HINCRBY', KEYS[2], 'timeouts', tmo)
end

local a_rate = tonumber(p[3])
local a_until = tonumber(p[6]) or 0
local cut = 0
if adaptive then
  if retry_ms > 0 and now + retry_ms > a_until then
    a_until = now + retry_ms
    redis.call('HSET', KEYS[1], 'a_until', a_until)
    redis.call('HINCRBY', KEYS[2], 'retry_after_pauses', 1)
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
        redis.call('HSET', KEYS[1], 'a_rate', tostring(a_rate), 'a_cut', now, 'a_inc', now)
        redis.call('HINCRBY', KEYS[2], 'backoffs', 1)
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
        redis.call('HDEL', KEYS[1], 'a_rate', 'a_inc')
        a_rate = nil
      else
        redis.call('HSET', KEYS[1], 'a_rate', tostring(a_rate), 'a_inc', now)
      end
    end
  end
end
if a_until <= now then
  a_until = 0
end
return { a_rate and tostring(a_rate) or '', a_until, tostring(o_rate), cut }
