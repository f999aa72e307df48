-- seen.lua: whether a site's seen filters hold fingerprints, without adding them
-- (`streams-sched url`, transfer/finding.py). Read-only: run with EVALSHA_RO or EVAL_RO.
-- It asks each filter as enqueue.lua's dedupe does (lib/bloom.lua: seen_in, add false):
-- an exact set (up to 1,024 fingerprints) answers for certain, a Bloom filter may say
-- seen for a fingerprint it never took (at most its error rate).
--
-- include: bloom
--
-- KEYS[1..]    filters   pairs of a site's seen filter keys (filter, its meta): the current
--                        filter first, then older revisit buckets
-- ARGV[1]      dedupe back-end: 'bf' or 'bitmap'
-- ARGV[2]      Bloom error rate
-- ARGV[3]      Bloom initial capacity
-- ARGV[4]      Bloom expansion factor
-- ARGV[5..]    fingerprints
-- Returns per filter {form ('exact' or 'bloom'), then per fingerprint 1 seen / 0 not}.

local mode = ARGV[1]
local err, cap, expansion = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fps = {}
for i = 5, #ARGV do
  fps[#fps + 1] = ARGV[i]
end
local out = {}
for f = 1, #KEYS, 2 do
  local form = filter_form(mode, KEYS[f], KEYS[f + 1])
  local res = seen_in(mode, KEYS[f], KEYS[f + 1], fps, err, cap, expansion, false)
  if res.err then
    return res
  end
  local part = { form }
  for i = 1, #fps do
    part[#part + 1] = 1 - res[i]
  end
  out[#out + 1] = part
end
return out
