"""The window's Lua scripts (``ctxcore.state.redis.window``): every read of one window over
the conversation's slot, in one call.

``WINDOW_LUA`` reads the tail itself (newest-first pages until the stored counts fill the
budget, ``READ_TAIL_FN_LUA``).
"""

from __future__ import annotations

from ctxcore.state.redis.log_scripts import LOG_HELPERS_LUA, READ_TAIL_FN_LUA

__all__ = ["WINDOW_KEY_SUFFIXES", "WINDOW_LUA"]

# KEYS of the script, in order (all in the conversation's slot).
WINDOW_KEY_SUFFIXES: tuple[str, ...] = (
    "state:history",
    "state:head",
    "budget",
    "log",
    "log:run",
    "log:real",
    "log:other",
    "compaction",
    "log:seq",
    "log:end",
    "archive:index",
)

# The state, its cursor and pinned entries, the log's end and the existence check. The
# cursor, pinned ids and archive version come from the head the save scripts write
# ("cursor|pinned,ids|archive version"); a head without the version, or a state saved before
# heads existed, is decoded instead.
_READS = """
local state = redis.call('LINDEX', KEYS[1], 0)
local cursor, pinned_ids, archive = '', '', nil
local decoded = nil
local function state_field(name)
  if decoded == nil then
    decoded = cjson.decode(state)
  end
  return decoded[name]
end
local head = redis.call('GET', KEYS[2])
if head then
  local bar = string.find(head, '|', 1, true)
  cursor = string.sub(head, 1, bar - 1)
  local rest = string.sub(head, bar + 1)
  local second = string.find(rest, '|', 1, true)
  if second then
    pinned_ids, archive = string.sub(rest, 1, second - 1), tonumber(string.sub(rest, second + 1))
  else
    pinned_ids = rest
  end
elseif state then
  if type(state_field('covered_until')) == 'string' then
    cursor = state_field('covered_until')
  end
  if type(state_field('pinned')) == 'table' then
    pinned_ids = table.concat(state_field('pinned'), ',')
  end
end
local pinned = {}
for id in string.gmatch(pinned_ids, '[^,]+') do
  local seq = tonumber(id)
  for _, e in ipairs(redis.call('XRANGE', KEYS[4], seq .. '-0', seq .. '-0')) do
    pinned[#pinned + 1] = seq
    pinned[#pinned + 1] = entry_field(e, 'm')
    pinned[#pinned + 1] = ''
  end
end
local last = redis.call('GET', KEYS[10]) or redis.call('GET', KEYS[9]) or '0'
if not state and tonumber(last) == 0 then
  return {false, {}, {0, 0, 0, {}, {}}, {}, '0', -2, 0, false}  -- no such conversation: nothing written
end
local after = 0
if cursor ~= '' then
  after = tonumber(cursor)
end
"""

# The compaction hash, the budget (written only when it differs), the counter's PTTL and the
# recall index when the caller's copy is older than the state's.
_RETURN = """
local compaction = redis.call('HGETALL', KEYS[8])
local ttl = tonumber(ARGV[4])
if redis.call('GET', KEYS[3]) ~= ARGV[1] then
  if ttl > 0 then
    redis.call('SET', KEYS[3], ARGV[1], 'PX', expiry_of(KEYS[9], ttl))
  else
    redis.call('SET', KEYS[3], ARGV[1])
  end
end
local left = -1
if ttl > 0 then
  left = redis.call('PTTL', KEYS[9])
end
local index = false
if ARGV[5] ~= '' and state then
  if archive == nil then
    archive = tonumber(state_field('archive_version')) or 0
  end
  if archive > tonumber(ARGV[5]) then
    index = redis.call('GET', KEYS[11]) or false
  end
end
return {state or false, pinned, tail, compaction, last, left, after, index}
"""

# One window's reads in one call. KEYS: WINDOW_KEY_SUFFIXES. ARGV: budget, page size,
# encoding, retention ms (0: none; else a budget written gets the counter's expiry, and the
# counter's PTTL is returned for the refresh), the caller's recall index version ('': recall
# not wanted; else the stored index, base64, is returned when the state's archive version is
# newer). Nothing is written for a conversation with neither log nor state (the existence
# check is part of the read). Returns {state JSON or false, pinned (flat seq, JSON, ''), the
# tail as READ_TAIL_LUA, the compaction hash (flat), the log's last seq, the counter's PTTL
# (-1 without a retention, -2 with no conversation), the cursor seq (0: none), the index or
# false}.
WINDOW_LUA = (
    LOG_HELPERS_LUA
    + READ_TAIL_FN_LUA
    + _READS
    + """
local tail = read_tail(KEYS[4], KEYS[5], KEYS[6], KEYS[7], after, tonumber(ARGV[2]), tonumber(ARGV[1]), ARGV[3])
"""
    + _RETURN
)
