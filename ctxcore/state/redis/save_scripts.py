"""The Redis state store's save scripts (``ctxcore.state.redis.RedisStateStore.save``): the
version check and the write in one script over the conversation's slot."""

from __future__ import annotations

from ctxcore.state.redis.retention import EXPIRY_LUA

__all__ = ["SAVE_ARCHIVE_LUA", "SAVE_LUA"]

# Both scripts start alike: the version check (KEYS[1] against ARGV[1]), the bump, the state
# pushed onto the history (KEYS[2], ARGV[2]) trimmed to ARGV[3] versions.
_CAS_LUA = (
    EXPIRY_LUA
    + """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], current + 1)
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
"""
)

# KEYS: version, history, head, log counter. ARGV: expected version, state JSON, versions to
# keep, head ("cursor|pinned,ids|archive version": what the window script needs before it can
# read the log),
# retention ms (0: none; else the written keys get the conversation's expiry, the counter's).
SAVE_LUA = (
    _CAS_LUA
    + """
redis.call('SET', KEYS[3], ARGV[4])
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  local e = expiry_of(KEYS[4], ttl)
  for i = 1, 3 do
    redis.call('PEXPIRE', KEYS[i], e)
  end
end
return 1
"""
)

# SAVE_LUA plus the recall archive, in the same script so a lost race writes neither.
# KEYS: version, history, archive chunks (hash chunk id -> chunk JSON), archive index, head,
# log counter. ARGV: expected version, state JSON, versions to keep, index bytes, head,
# retention ms (as SAVE_LUA), then pairs of (chunk id, chunk JSON). A chunk id already stored
# keeps its first text (HSETNX).
SAVE_ARCHIVE_LUA = (
    _CAS_LUA
    + """
for i = 7, #ARGV, 2 do
  redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('SET', KEYS[4], ARGV[4])
redis.call('SET', KEYS[5], ARGV[5])
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  local e = expiry_of(KEYS[6], ttl)
  for i = 1, 5 do
    redis.call('PEXPIRE', KEYS[i], e)
  end
end
return 1
"""
)
