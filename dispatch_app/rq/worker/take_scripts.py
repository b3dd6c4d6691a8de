"""The Lua scripts of a PipelineWorker's take (``fetch.Fetcher``): take, rescue, settle.

Each moves RQ's keys the way RQ's own code does (``dispatch_app.rq.internals``), in one round trip. A
key of the wrong type (anyone on Redis's network may write any key) fails only its own step: a script
is not rolled back, so an error half-way would strand the jobs it had already moved.
"""

from __future__ import annotations

from dispatch_app.rq.fields import TAKEN_BY  # the take writes it

# KEYS: the suspension flag, then (queue, intermediate) pairs.
# ARGV: [1] how many jobs at most, [2] the job hash key prefix, [3] the worker's
# name, [4] the plan: which pairs to scan in which order, each as its KEYS index
# and 'n' (new work: as many as allowed) or 'r' (a late lane, ``dispatch_app.domains.lanes``:
# one job, and only when nothing else was taken in this call), [5] (optional) a job
# id already popped from the queue of pair [6] (the blocking wait's catch), [7] '1'
# if it still has to go to the intermediate list, [8] (optional) the popped job's
# start: the timeout its writes assumed ('' for none), [9] how many commands, then
# each command as its length and its words.
# A key of the wrong type (anyone on Redis's network may write any key) fails only its own step, never the take
# (a script is not rolled back: jobs moved before the error would be stranded): the first such error comes back as
# the reply's first element, in place of 0, and a job whose key holds no hash comes back as (pair, id, error).
TAKE_SCRIPT = (
    """
if redis.call('EXISTS', KEYS[1]) == 1 and not ARGV[5] then return {1} end
local out = {0}
local left = tonumber(ARGV[1])
local taken = 0
local function refused(reply, key)
  if type(reply) ~= 'table' or not reply['err'] then return false end
  if out[1] == 0 then out[1] = key .. ': ' .. reply['err'] end
  return true
end
local function move(pair)
  local id = redis.pcall('LMOVE', KEYS[pair], KEYS[pair + 1], 'LEFT', 'RIGHT')
  if refused(id, KEYS[pair]) then return false end
  return id
end
local function take(pair, id)
  local key = ARGV[2] .. id
  local hash = redis.pcall('HGETALL', key)
  if #hash == 0 then
    redis.call('LREM', KEYS[pair + 1], 1, id)
    if hash['err'] then table.insert(out, {pair, id, hash['err']}) end
    return nil
  end
  redis.call('HSET', key, '"""
    + TAKEN_BY
    + """', ARGV[3])
  local entry = {pair, id, hash}
  table.insert(out, entry)
  left = left - 1
  taken = taken + 1
  return entry
end
-- The recorded start, if the job is the one it was recorded for: its timeout sets the
-- execution's TTL, and a repeating job takes RQ's own path (the worker writes those itself).
local function start(entry)
  local hash, timeout, repeating = entry[3], '', false
  for i = 1, #hash, 2 do
    if hash[i] == 'timeout' then timeout = hash[i + 1] elseif hash[i] == 'repeats_left' then repeating = true end
  end
  if timeout ~= ARGV[8] or repeating then return end
  local at = 10
  for _ = 1, tonumber(ARGV[9]) do
    local n = tonumber(ARGV[at])
    if refused(redis.pcall(unpack(ARGV, at + 1, at + n)), ARGV[at + 2]) then return end
    at = at + n + 1
  end
  table.insert(entry, 1)
end
if ARGV[5] then
  local pair = tonumber(ARGV[6])
  if ARGV[7] == '1' and refused(redis.pcall('RPUSH', KEYS[pair + 1], ARGV[5]), KEYS[pair + 1]) then
    redis.call('LPUSH', KEYS[pair], ARGV[5])  -- back at its queue's head
  else
    local entry = take(pair, ARGV[5])
    if entry and ARGV[8] then start(entry) end
  end
end
-- A late lane's job is taken alone: held in the worker's hand behind nothing and ahead of nothing,
-- so new work arriving while it runs waits for that one job at most.
for pair, lane in string.gmatch(ARGV[4], '(%d+)(%a)') do
  pair = tonumber(pair)
  if left <= 0 then break end
  if lane == 'n' then
    while left > 0 do
      local id = move(pair)
      if not id then break end
      take(pair, id)
    end
  elseif taken == 0 then
    local id = move(pair)
    while id and not take(pair, id) do
      id = move(pair)
    end
  end
end
return out
"""
)

# KEYS: (queue, intermediate) pairs. ARGV: [1] job hash key prefix, [2] worker hash key prefix, [3] (optional)
# this worker's name. A job in an intermediate list whose taker's hash is gone (it died), or that this worker took
# and no longer holds, and that never started goes back to the head of its queue; returns how many. A key of the
# wrong type is passed over (its id first back in the queue, then out of the list: an error loses no job).
RESCUE_SCRIPT = (
    """
local moved = 0
for pair = 1, #KEYS, 2 do
  local ids = redis.pcall('LRANGE', KEYS[pair + 1], 0, -1)
  if ids['err'] then ids = {} end
  for _, id in ipairs(ids) do
    local key = ARGV[1] .. id
    local owner = redis.pcall('HGET', key, '"""
    + TAKEN_BY
    + """')
    if type(owner) == 'string' and (owner == ARGV[3] or redis.call('EXISTS', ARGV[2] .. owner) == 0)
       and redis.call('HGET', key, 'status') == 'queued' then
      redis.call('LPUSH', KEYS[pair], id)
      redis.call('LREM', KEYS[pair + 1], 1, id)
      moved = moved + 1
    end
  end
end
return moved
"""
)


# After a take whose reply never came (a dropped connection): what became of the job the blocking wait popped.
# KEYS: [1] its hash, [2] its queue, [3] the intermediate list. ARGV: [1] the job id, [2] this worker's name,
# [3] the execution key its recorded start would have created ('' without one), [4] how far into the queue to
# look (tuning.RQ_LIST_READ_MAX: a popped id is not there at all, or back at its head).
# 'started': the take wrote the start (the job is this worker's to run); 'requeued': it went back to the head
# of its queue (the take never ran, or took it without the start); 'listed', 'gone' (a key that is no hash
# too), 'other': nothing to do.
SETTLE_SCRIPT = """
local status = redis.pcall('HGET', KEYS[1], 'status')
if redis.call('EXISTS', KEYS[1]) == 0 or type(status) == 'table' then return 'gone' end
if status == 'started' then
  if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], 'worker_name') == ARGV[2]
     and redis.call('EXISTS', ARGV[3]) == 1 then return 'started' end
  return 'other'
end
if status ~= 'queued' then return 'other' end
if redis.call('LPOS', KEYS[2], ARGV[1], 'MAXLEN', ARGV[4]) then return 'listed' end
redis.call('LREM', KEYS[3], 1, ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[1])
return 'requeued'
"""
