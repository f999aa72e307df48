-- delayed.lua: a site's delayed requests, a ZSET scored by due time (ms) whose members
-- are "<stream index>:<seq>:<payload>": moving the due ones into their streams, and when
-- the next one is due.
-- needs: codes, streams

-- Move up to `limit` due delayed requests into their streams. Returns the count moved,
-- the count that left the ZSET (moved, or dead-lettered as malformed) and the count moved
-- per stream index. `bare`: the caller knows the site has no stream, so each stream is
-- made without asking whether it exists (a revisit's promotion, every visit).
local function promote_due(delayed, dlq, stats, streams, group, now, limit, bare)
  local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)
  local moved = 0
  local per_stream = {}
  for _, member in ipairs(due) do
    local sep1 = string.find(member, ':', 1, true)
    local sep2 = sep1 and string.find(member, ':', sep1 + 1, true)
    local idx = sep1 and tonumber(string.sub(member, 1, sep1 - 1))
    local stream = idx and streams[idx]
    if stream and sep2 then
      if not per_stream[idx] then
        if bare then
          redis.call('XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM')
        else
          ensure_group(stream, group)
        end
        per_stream[idx] = 0
      end
      redis.call('XADD', stream, '*', 'r', string.sub(member, sep2 + 1))
      per_stream[idx] = per_stream[idx] + 1
      moved = moved + 1
    else
      dead_letter(dlq, stats, delayed, '', member, 'malformed delayed-queue member', 0, '', now)
    end
  end
  -- every member read leaves, moved or dead-lettered: one ZREM for all of them (a
  -- revisit's promotion is one of the commands a tracked page's fetch pays for), in
  -- runs of 1,000 (unpack's limit is a few thousand values; a reclaimer --batch is not)
  for i = 1, #due, 1000 do
    redis.call('ZREM', delayed, unpack(due, i, math.min(i + 999, #due)))
  end
  if moved > 0 then
    redis.call('HINCRBY', stats, 'promoted', moved)
  end
  return moved, #due, per_stream
end

-- The due time (ms) of a site's first delayed request, -1 none.
local function next_due_of(delayed)
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2])
  end
  return -1
end
