-- load_site.lua: what `streams-sched load` restores of ONE site after its requests
-- (transfer/load.py): the counters a load cannot rebuild (pages accepted under its page
-- cap, its tracked pages, their demand and stretch) and, from a dump taken with --seen,
-- its seen filters, which the load wrote to short-lived keys first. Once per line of the
-- file: the load's ledger says whether this site's line was taken, and takes it in the
-- same call, so a load run again after a kill does not write it twice.
-- The filters replace the site's own, which hold the fingerprints of the requests the
-- load just added, all of them in the dump's filters too (they were accepted there).
--
-- include: (nothing)
--
-- KEYS[1]      stats     HASH of counters
-- KEYS[2]      sites     SET, the shard's site registry
-- then         the load's ledger (a bitmap of the file's lines), then pairs: a short-lived
--              key the load wrote, the seen key it becomes
-- ARGV[1]      the site's name
-- ARGV[2]      the line of the file (its bit in the ledger)
-- ARGV[3]      n, then n field/value pairs of counters to set
-- ARGV[...]    per pair of keys, the seen key's TTL in ms (-1 none)
-- Returns 1 when it restored the site now, 0 when the ledger had the line.

local ledger = KEYS[3]
local line = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local pairs_at = 4 + 2 * n
if redis.call('GETBIT', ledger, line) == 1 then
  for i = 4, #KEYS, 2 do
    redis.call('DEL', KEYS[i])
  end
  return 0
end
if n > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 4, 3 + 2 * n))
end
local p = 0
for i = 4, #KEYS, 2 do
  local ttl = tonumber(ARGV[pairs_at + p])
  p = p + 1
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('RENAME', KEYS[i], KEYS[i + 1])
    if ttl and ttl > 0 then
      redis.call('PEXPIRE', KEYS[i + 1], ttl)
    else
      redis.call('PERSIST', KEYS[i + 1])
    end
  end
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SETBIT', ledger, line, 1)
return 1
