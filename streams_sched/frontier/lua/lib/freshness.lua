-- freshness.lua: a site's freshness multiplier, moved toward spending its revisit budget
-- (the mirror of worker/freshness.py: next_mu, first_mu; tests/test_freshness.py checks
-- the two agree on a grid).
-- needs: (nothing)

local FRESH_GAIN, FRESH_FIRST, FRESH_MU_MIN, FRESH_MU_MAX = 0.5, 0.02, 1e-3, 1e9
local FRESH_MAX_STEP = math.log(4.0)

local function first_mu(tracked, budget)
  return math.min(FRESH_MU_MAX, math.max(FRESH_MU_MIN, FRESH_FIRST * math.max(tracked, 1) / budget))
end

-- mu after `acked` of the site's `tracked` pages were scheduled, their planned fetches
-- summing to `demand` per second against `budget` (> 0): over a round of the site's pages
-- it moves FRESH_GAIN of the way (in log) to the value that spends the budget.
local function next_mu(mu, demand, budget, acked, tracked)
  if not mu or mu <= 0 then
    mu = first_mu(tracked, budget)
  end
  local weight = math.min(1.0, acked / math.max(tracked, 1))
  local ratio = math.max(demand, budget * 1e-6) / budget
  local step = math.max(-FRESH_MAX_STEP, math.min(FRESH_MAX_STEP, FRESH_GAIN * weight * math.log(ratio)))
  return math.min(FRESH_MU_MAX, math.max(FRESH_MU_MIN, mu * math.exp(step)))
end
