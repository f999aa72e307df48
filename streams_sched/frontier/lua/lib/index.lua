-- index.lua: the shard's indexes of its sites, which name the sites a worker leases or
-- takes over next, and putting a site in them.
-- needs: (nothing)
--
-- Every site's keys share its shard's hash tag with the shard's indexes (keys.py):
--   ready[t]  ZSET site -> ms from which it may be leased, for task type t (1 http, 2 browser):
--             sites with backlog of that type, or with delayed requests (in both)
--   leased    ZSET site -> ms of a lease it holds (a takeover looks once that is a lease old)
--   fresh[t]  LIST of new sites with work of type t due now (enqueue.lua adds them,
--             lease.lua moves them into ready[t])

-- Put a site in its shard's indexes as its state says: in ready[t] from `at` (ms) while
-- it has backlog of type t, from its next due time while it has delayed requests, out
-- of it otherwise; in leased while it has pending entries (`lease_at`: the score of a
-- site not yet there; a site already there keeps its older one).
local function reindex(ready, leased, site, backlog, pending, next_due, at, lease_at)
  for t = 1, 2 do
    if backlog[t] > 0 then
      redis.call('ZADD', ready[t], at, site)
    elseif next_due >= 0 then
      redis.call('ZADD', ready[t], next_due, site)
    else
      redis.call('ZREM', ready[t], site)
    end
  end
  if pending > 0 then
    redis.call('ZADD', leased, 'NX', lease_at, site)
  else
    redis.call('ZREM', leased, site)
  end
end

-- A site got backlog of task type t (1 http, 2 browser): ready from `at` at the latest.
local function mark_ready(ready, t, site, at)
  redis.call('ZADD', ready[t], 'LT', at, site)
end
