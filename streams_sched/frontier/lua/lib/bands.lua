-- bands.lua: which priority band each of a site's next requests of one task type comes
-- from. Smooth weighted round robin over the bands that have backlog, with the weights of
-- STREAMS_BAND_RATIO (high:default:low): every band is served in proportion, and low is
-- never starved while high has work. The rotation's state, a running score per band, is
-- kept in the site's stats hash between calls (field swrr1 for http, swrr2 for browser).
-- needs: codes

-- How many of the next `n` requests to take from each band, given each band's backlog
-- and weight; `cur` holds the running scores and is moved on in place.
local function band_takes(cur, weights, backlog, n)
  -- built at its size (BANDS = 3): a lease builds these for every site it leases
  local take = { 0, 0, 0 }
  for _ = 1, n do
    local total, best = 0, nil
    for b = 1, BANDS do
      if backlog[b] - take[b] > 0 then
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
  return take
end

-- Take `n` requests of task type t from a site whose bands have `backlog` (per band):
-- the takes per band, with the rotation state read from and written to `stats`. With one
-- band backlogged the state cannot change, so it is neither read nor written; all zero,
-- it is deleted (absent = all zero: a drained site keeps no state).
local function rotate_bands(stats, t, weights, backlog, n)
  local field = 'swrr' .. t
  local cur = { 0, 0, 0 }
  local backlogged = 0
  for b = 1, BANDS do
    if backlog[b] > 0 then
      backlogged = backlogged + 1
    end
  end
  if backlogged < 2 then
    return band_takes(cur, weights, backlog, n)
  end
  local saved = redis.call('HGET', stats, field)
  if saved then
    local i = 1
    for v in string.gmatch(saved, '[^,]+') do
      cur[i] = tonumber(v) or 0
      i = i + 1
    end
  end
  local take = band_takes(cur, weights, backlog, n)
  local moved = false
  for b = 1, BANDS do
    moved = moved or cur[b] ~= 0
  end
  if moved then
    redis.call('HSET', stats, field, table.concat(cur, ','))
  else
    redis.call('HDEL', stats, field)
  end
  return take
end
