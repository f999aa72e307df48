-- rate.lua: a site's effective rate, written once: what lease.lua applies and reports,
-- what status.lua reports (the CLI and the monitor show it), and the rate feedback.lua
-- backs off from.
-- needs: (nothing)
--
-- The rate is the site's policy rate, else the crawl's default; when that is 0 (none)
-- and robots.txt is obeyed, 1 / the site's Crawl-delay; lowered by the adaptive back-off
-- (a_rate, see feedback.lua) when that is on. An operator's pause (the policy's, else the
-- crawl's default) and a Retry-After (a_until, ms) hold the site whatever the rate.

-- A site's policy fields by name, in one HMGET: those of its rate, and `more`.
local function policy_fields(policy, more)
  local names = { 'paused', 'rate', 'burst', 'robots_delay', 'a_rate', 'a_until' }
  for _, name in ipairs(more) do
    names[#names + 1] = name
  end
  local got = redis.call('HMGET', policy, unpack(names))
  local p = {}
  for i, name in ipairs(names) do
    p[name] = got[i]
  end
  return p
end

-- The rate a site runs at without back-off (req/s, 0 = unlimited), and why: 'policy'
-- (its policy's rate, else the crawl's default), 'robots' (1 / its Crawl-delay, when
-- robots.txt is obeyed and no rate is set) or 'unlimited'.
local function base_rate(rate, default_rate, robots_delay, robots_obey)
  local r = tonumber(rate) or tonumber(default_rate) or 0
  if r > 0 then
    return r, 'policy'
  end
  local delay = tonumber(robots_delay)
  if robots_obey and delay and delay > 0 then
    return 1 / delay, 'robots'
  end
  return 0, 'unlimited'
end

-- A site's effective rate at Redis time `now`: rate (req/s, 0 = unlimited), burst (the
-- bucket's size; nil: the rate's), why, until, and the rate without back-off. why is
-- 'paused' (until -1), 'retry-after' (until = the ms the pause ends), else base_rate's
-- or 'backoff' (until 0). `p` holds the policy fields (policy_fields); d_rate, d_burst,
-- d_paused the crawl's defaults; `flags` the politeness in force: 'a' adaptive back-off,
-- 'r' robots.txt obeyed.
local function effective_rate(p, d_rate, d_burst, d_paused, flags, now)
  local adaptive = string.find(flags, 'a', 1, true)
  local base, why = base_rate(p.rate, d_rate, p.robots_delay, string.find(flags, 'r', 1, true))
  local rate, burst = base, tonumber(p.burst) or tonumber(d_burst)
  if why == 'robots' then
    burst = 1
  end
  local a_rate = adaptive and tonumber(p.a_rate)
  if a_rate and (rate <= 0 or a_rate < rate) then
    rate, burst, why = a_rate, math.max(1, a_rate / 10), 'backoff'
  end
  if (p.paused or d_paused) == '1' then
    return rate, burst, 'paused', -1, base
  end
  local until_ms = adaptive and tonumber(p.a_until) or 0
  if until_ms > now then
    return rate, burst, 'retry-after', until_ms, base
  end
  return rate, burst, why, 0, base
end
