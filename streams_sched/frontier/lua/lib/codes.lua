-- codes.lua: the stream codes, the Lua side of the Python<->Lua contract
-- (streams_sched/frontier/keys.py holds the Python side; tests/test_contract.py checks
-- that both agree), and the two rules that turn a code into a task type or back.
-- needs: (nothing)
--
-- A site has STREAM_COUNT request streams, passed in KEYS in this order:
--   http:high http:default http:low browser:high browser:default browser:low
-- Scripts get and return a stream as its code, its 1-based position in that list:
--   1..STREAM_COUNT                        the (task, band) stream
--   SITE_TASK + 1 .. SITE_TASK + BANDS     band 1..BANDS (high, default, low) with the
--                                          task type from the site's policy (enqueue only)
--   DEAD_CODE + 1 .. DEAD_CODE + STREAM_COUNT  a dead letter of that stream (enqueue's
--                                          'load' keys only: streams-sched load)
--   SEEN_CODE                              a fingerprint to record, nothing to add (the same)

local STREAM_COUNT = 6
local BANDS = 3
local SITE_TASK = 10
local DEAD_CODE = 20
local SEEN_CODE = 30

-- The task type of stream code 1..STREAM_COUNT: 1 http, 2 browser.
local function task_of(code)
  return code > BANDS and 2 or 1
end

-- The stream code of task type t (1 http, 2 browser) and band b (1 high .. BANDS low).
local function stream_of(t, b)
  return (t - 1) * BANDS + b
end
