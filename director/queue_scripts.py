"""The Lua scripts of the prediction queue (:mod:`director.queue`), each one round trip that
names keys of one hash tag (one slot of a Redis Cluster)."""

# For each prediction (ARGV: its id, how many of KEYS are its shards, its account or ''; KEYS:
# its deployable's moves hash, then its shards), append to the shortest of its shards, or of
# the shards an operator moved its account to (``tracker.sharding``; streams of the same hash
# tag, named as its shards are); one round trip for many predictions. Returns the stream
# chosen for each.
ENQUEUE = """
local out = {}
local k = 1
for i = 1, #ARGV, 3 do
  local first, last = k + 1, k + tonumber(ARGV[i + 1])
  local streams = {}
  local moved = ARGV[i + 2] ~= '' and redis.call('HGET', KEYS[k], ARGV[i + 2])
  if moved then
    local prefix = string.match(KEYS[first], '^(.*:)%d+$')
    for shard in string.gmatch(moved, '%d+') do table.insert(streams, prefix .. shard) end
  end
  if #streams == 0 then
    for j = first, last do table.insert(streams, KEYS[j]) end
  end
  local best = streams[1]
  local best_len = redis.call('XLEN', best)
  for j = 2, #streams do
    local n = redis.call('XLEN', streams[j])
    if n < best_len then best = streams[j]; best_len = n end
  end
  k = last + 1
  redis.call('XADD', best, '*', 'id', ARGV[i])
  table.insert(out, best)
end
return out
"""


# Acknowledge and delete entries: KEYS[i] holds entry ARGV[i + 1]; ARGV[1] is the group.
ACK = """
for i = 1, #KEYS do
  redis.call('XACK', KEYS[i], ARGV[1], ARGV[i + 1])
  redis.call('XDEL', KEYS[i], ARGV[i + 1])
end
return #KEYS
"""


# New entries from streams in the order given, up to ARGV[3] in all, in one round trip: the
# round robin over shards that used to cost one XREADGROUP each. Returns the 1-based index of
# the last stream that had entries (0: none had any), then stream/messages pairs.
READ_IN_TURN = """
local want = tonumber(ARGV[3])
local out = {0}
for i, key in ipairs(KEYS) do
  if want <= 0 then break end
  local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want,
                         'STREAMS', key, '>')
  if got then
    local messages = got[1][2]
    out[1] = i
    table.insert(out, key)
    table.insert(out, messages)
    want = want - #messages
  end
end
return out
"""


# For each stream: how many entries wait unread by the group ARGV[1] (its length less its
# pending entries: acknowledged entries are deleted), and the id of the oldest of them (the
# first after the group's last delivered id; '' when none waits). First, Redis's clock in ms,
# which the ids' timestamps are read against. One round trip for a slot's streams.
BACKLOG = """
local now = redis.call('TIME')
local out = {tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
for _, key in ipairs(KEYS) do
  local waiting, oldest = 0, ''
  if redis.call('EXISTS', key) == 1 then
    for _, group in ipairs(redis.call('XINFO', 'GROUPS', key)) do
      local info = {}
      for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
      if info['name'] == ARGV[1] then
        waiting = redis.call('XLEN', key) - info['pending']
        if waiting > 0 then
          local first = redis.call('XRANGE', key, '(' .. info['last-delivered-id'], '+',
                                   'COUNT', 1)
          if #first > 0 then oldest = first[1][1] end
        end
      end
    end
  end
  table.insert(out, waiting)
  table.insert(out, oldest)
end
return out
"""
