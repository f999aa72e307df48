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
-- include: time, rate, answers
--
-- KEYS[1]  policy  HASH of the site's policy and shared state:
--                  a_rate, a_cut, a_inc, a_until (ms), robots_delay (s)
-- KEYS[2]  stats   HASH of counters: answers_ok, throttled, timeouts, backoffs, retry_after_pauses
-- KEYS[3]  window  STRING, the observed window "o_ts,o_n,o_ok,o_rate,o_okrate": since o_ts
--                  (ms), o_n answers of which o_ok healthy; the rates (per s) of the last
--                  full window. It expires OBS_TTL_MS after the last report, so a
--                  finished site keeps no politeness state
-- ARGV[1]  healthy answers          ARGV[2] 429 / 503 answers      ARGV[3] download timeouts
-- ARGV[4]  longest Retry-After in ms ('0' none)
-- ARGV[5]  robots.txt Crawl-delay in s, capped ('' not reported, '0' none)
-- ARGV[6]  '1' adaptive back-off on, '0' off (only counts and robots are recorded)
-- ARGV[7]  decrease factor (0 < f < 1)     ARGV[8] increase, req/s per second
-- ARGV[9]  floor, req/s                    ARGV[10] forget after ms
-- ARGV[11] the crawl's default rate ('' none)
-- Returns {a_rate ('' none), a_until ms (0 none), observed rate (string), cut (1/0)}

local counts = {}
local reply = report_answers(KEYS[1], counts, KEYS[3], ARGV, now_ms())
add_counts(KEYS[2], counts)
return reply
