-- answers.lua: what the workers saw of a site's answers (feedback.lua, and ack.lua for
-- healthy answers that ride along with their acks): the counters, the observed answer
-- window and the AIMD back-off of the site's rate; and the stats counters a script
-- collects and writes once at its end.
-- needs: rate

-- Stats counters to add: field -> increment. A script collects them and writes
-- them at its end, so several counters cost one write, not a HINCRBY each.
local function tally(counts, field, n)
  counts[field] = (counts[field] or 0) + n
end

-- One HINCRBY per field (a script that writes nothing else to stats).
local function add_counts(stats, counts)
  for field, n in pairs(counts) do
    redis.call('HINCRBY', stats, field, n)
  end
end

-- What the workers saw of ONE site's answers (feedback.lua, and ack.lua for healthy
-- answers that ride along with their acks): counters (added to `counts`, see tally()),
-- the observed window and the AIMD state. `A` holds feedback.lua's ARGV[1..11] (see
-- its header); returns its reply.
--
-- The observed window is one string, "o_ts,o_n,o_ok,o_rate,o_okrate", that expires
-- OBS_TTL_MS after the last report: one GET and one SET per report.
local function report_answers(policy, counts, window, A, now)
  local ok, thr, tmo = tonumber(A[1]), tonumber(A[2]), tonumber(A[3])
  local retry_ms = tonumber(A[4]) or 0
  local adaptive = A[6] == '1'
  local decrease, increase = tonumber(A[7]), tonumber(A[8])
  local floor, forget = tonumber(A[9]), tonumber(A[10])

  local OBS_TTL_MS = 3000
  local p = policy_fields(policy, { 'a_cut', 'a_inc' })
  local o = {}
  local raw = redis.call('GET', window)
  if raw then
    o = { string.match(raw, '^([^,]*),([^,]*),([^,]*),([^,]*),([^,]*)$') }
  end
  if A[5] ~= '' then
    p.robots_delay = A[5]
    redis.call('HSET', policy, 'robots_delay', A[5])
  end
  -- the rate without back-off (a Crawl-delay is recorded only where robots.txt is obeyed)
  local base = base_rate(p.rate, A[11], p.robots_delay, true)

  -- observed answer rate: answers counted over windows of at least one second
  local n = ok + thr + tmo
  local o_ts, o_n, o_ok = tonumber(o[1]), (tonumber(o[2]) or 0) + n, (tonumber(o[3]) or 0) + ok
  local o_rate, o_okrate = tonumber(o[4]) or 0, tonumber(o[5]) or 0
  if o_ts == nil then
    o_ts = now
  elseif now - o_ts >= 1000 then
    o_rate, o_okrate = o_n * 1000 / (now - o_ts), o_ok * 1000 / (now - o_ts)
    o_ts, o_n, o_ok = now, 0, 0
  end
  redis.call('SET', window, table.concat({ o_ts, o_n, o_ok, tostring(o_rate), tostring(o_okrate) }, ','),
    'PX', OBS_TTL_MS)

  if ok > 0 then
    tally(counts, 'answers_ok', ok)
  end
  if thr > 0 then
    tally(counts, 'throttled', thr)
  end
  if tmo > 0 then
    tally(counts, 'timeouts', tmo)
  end

  local a_rate = tonumber(p.a_rate)
  local a_until = tonumber(p.a_until) or 0
  local cut = 0
  if adaptive then
    if retry_ms > 0 and now + retry_ms > a_until then
      a_until = now + retry_ms
      redis.call('HSET', policy, 'a_until', a_until)
      tally(counts, 'retry_after_pauses', 1)
    end
    local a_cut = tonumber(p.a_cut)
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
          redis.call('HSET', policy, 'a_rate', tostring(a_rate), 'a_cut', now, 'a_inc', now)
          tally(counts, 'backoffs', 1)
          cut = 1
        end
      end
    elseif a_rate and ok > 0 then
      local since = now - (tonumber(p.a_inc) or now)
      if since >= 200 then
        if o_rate >= 0.8 * a_rate then
          a_rate = a_rate + increase * since / 1000
        end
        if (base > 0 and a_rate >= base) or (base <= 0 and a_cut and now - a_cut >= forget) then
          redis.call('HDEL', policy, 'a_rate', 'a_inc')
          a_rate = nil
        else
          redis.call('HSET', policy, 'a_rate', tostring(a_rate), 'a_inc', now)
        end
      end
    end
  end
  if a_until <= now then
    a_until = 0
  end
  return { a_rate and tostring(a_rate) or '', a_until, tostring(o_rate), cut }
end
