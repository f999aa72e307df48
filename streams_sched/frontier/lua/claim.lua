-- claim.lua: take over expired leases of ONE site with XAUTOCLAIM.
-- An entry whose deliveries (prior requeues + deliveries in the pending list)
-- exceed the limit goes to the dead-letter stream with the reason instead.
-- mode 'claim'   (a worker with nothing else to do): the entries become this
--                consumer's leases and are returned.
-- mode 'requeue' (the reclaimer daemon): the entries go back to the end of their
--                stream as new entries (field d keeps the delivery count), so
--                any worker can lease them.
--
-- include: codes, time, streams, index
--
-- KEYS[1]      dlq       dead-letter stream
-- KEYS[2]      stats     HASH of counters
-- KEYS[3..8]   streams   http:high http:default http:low browser:high browser:default browser:low
-- KEYS[9]      ready:http     ZSET of the shard's sites with http work (lib/index.lua)
-- KEYS[10]     ready:browser  ZSET of the shard's sites with browser work
-- KEYS[11]     leased         ZSET of the shard's sites with leased entries
-- KEYS[12]     policy         HASH of the site's policy (its revisit, for the claim mode)
-- KEYS[13]     halt           STRING set by `streams-sched move` (keys.py): while it exists the
--                             claim mode takes nothing over (a move stops leasing)
-- ARGV[1]      consumer group
-- ARGV[2]      consumer claiming (node id, or the reclaimer's name)
-- ARGV[3]      minimum idle time in ms (the lease time)
-- ARGV[4]      max entries to take
-- ARGV[5]      max deliveries
-- ARGV[6]      mode: 'claim' or 'requeue'
-- ARGV[7]      stream mask: six chars, '1' = consider that stream
-- ARGV[8]      the site's name (its member in the shard's indexes)
-- Returns {taken, dead, the site's policy revisit ('' none; claim mode), then (claim mode)
--          per entry: stream index, id, payload, prior deliveries}
--
-- The policy revisit goes with the entries a worker takes over, as with those lease.lua
-- gives: a page tracked by its site's policy is tracked whoever finishes it, even a worker
-- that never leased the site.

local group, consumer = ARGV[1], ARGV[2]
local min_idle, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_deliveries, mode, mask = tonumber(ARGV[5]), ARGV[6], ARGV[7]
if mode == 'claim' and redis.call('EXISTS', KEYS[13]) == 1 then
  return { 0, 0, '' }
end
local now = now_ms()
local taken, dead = 0, 0
local out = {}

for s = 1, STREAM_COUNT do
  if budget <= 0 then
    break
  end
  local stream = KEYS[2 + s]
  if string.sub(mask, s, s) == '1' and redis.call('EXISTS', stream) == 1 then
    local res = redis.pcall('XAUTOCLAIM', stream, group, consumer, min_idle, '0-0', 'COUNT', budget)
    if type(res) == 'table' and not res.err then
      for _, e in ipairs(res[2]) do
        local id = e[1]
        local payload, d = entry_fields(e[2])
        local p = redis.call('XPENDING', stream, group, id, id, 1)
        local count = (p[1] and tonumber(p[1][4])) or 1
        local total = count + d
        if total > max_deliveries or not payload then
          local reason = 'delivered ' .. total .. ' times (STREAMS_MAX_DELIVERIES=' .. max_deliveries .. ')'
          if not payload then
            reason = 'entry has no payload field r'
          end
          dead_letter(KEYS[1], KEYS[2], stream, id, payload, reason, total, consumer, now)
          redis.call('XACK', stream, group, id)
          redis.call('XDEL', stream, id)
          dead = dead + 1
        elseif mode == 'requeue' then
          redis.call('XADD', stream, '*', 'r', payload, 'd', total - 1)
          redis.call('XACK', stream, group, id)
          redis.call('XDEL', stream, id)
          taken = taken + 1
        else
          out[#out + 1] = s
          out[#out + 1] = id
          out[#out + 1] = payload
          -- the deliveries before this one, the expired ones included
          out[#out + 1] = total - 1
          taken = taken + 1
        end
        budget = budget - 1
      end
      if dead > 0 then
        retire_if_empty(stream)
      end
    end
  end
end

if taken > 0 then
  redis.call('HINCRBY', KEYS[2], 'reclaimed', taken)
end
-- the site's place in the indexes: requeued entries are backlog again; a site with
-- leases left is looked at again at once while more of them are expired (a worker that
-- died holding many leases of a site must not give them up one per lease time), else
-- one lease from now; a site without leases leaves the index
local streams = { KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8] }
local backlog, pending = site_backlog(streams, group, false)
for t = 1, 2 do
  if backlog[t] > 0 then
    mark_ready({ KEYS[9], KEYS[10] }, t, ARGV[8], now)
  end
end
if pending > 0 then
  local at = now
  for s = 1, STREAM_COUNT do
    -- every stream, not only the masked ones: another worker may take the others
    local p = redis.pcall('XPENDING', streams[s], group, 'IDLE', min_idle, '-', '+', 1)
    if type(p) == 'table' and p[1] then
      at = now - min_idle
      break
    end
  end
  redis.call('ZADD', KEYS[11], at, ARGV[8])
else
  redis.call('ZREM', KEYS[11], ARGV[8])
end
local revisit = ''
if #out > 0 then
  revisit = redis.call('HGET', KEYS[12], 'revisit') or ''
end
local reply = { taken, dead, revisit }
for _, v in ipairs(out) do
  reply[#reply + 1] = v
end
return reply
