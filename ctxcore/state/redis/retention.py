"""Retention on Redis: every key of a conversation carries the conversation's TTL.

The keys of a conversation (``RETAINED_SUFFIXES``, under its hash tag, one cluster slot) get
the tenant's full retention at each append (inside the append script) and at a window whose
read (``WINDOW_LUA`` returns the log counter's ``PTTL``) finds it more than an hour below
the full retention (``RedisRetention.refresh``). Every other write gives the keys it
creates or rewrites the log counter's remaining TTL (``EXPIRY_LUA``'s ``expiry_of``), so
the whole conversation expires at one instant: a stale key outliving the log could be read
by a later conversation of the same id (a stored count, a state).

The conversation's lock (``workers.locks``) has its own timeout and is never touched. Keys
outside the slot are the tenant's listing and the scheduler's: appends and refreshes score
the conversation in ``<prefix>:tenant:{<tenant>}:active`` (beside the listing, same slot),
and the workers' sweep (``workers.retention``) unlists what expired.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import redis
from redis.cluster import RedisCluster

from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.common import translated
from ctxcore.state.retention import Retention

__all__ = [
    "EXPIRY_LUA",
    "HASH_OPS_LUA",
    "OFFLOAD_SUFFIX",
    "REFRESH_LUA",
    "REPLACE_LIST_LUA",
    "RETAINED_SUFFIXES",
    "SET_LUA",
    "UNLIST_LUA",
    "RedisRetention",
    "tenant_activity_key",
    "tenant_index_key",
]

# Every key of a conversation but its offloads and lock, the log counter first: it is the
# reference whose TTL windows read and later writes copy. ``compaction`` is the workers'
# failure record (``workers.failures``), ``proxyidx`` the proxy's hash index, ``journal``
# the stage journal (``ctxcore.state.redis.journal``).
RETAINED_SUFFIXES: tuple[str, ...] = (
    "log:seq",
    "log",
    "log:dedupe",
    "log:end",
    "log:run",
    "log:real",
    "log:other",
    "state:version",
    "state:history",
    "state:head",
    "budget",
    "archive",
    "archive:index",
    "compaction",
    "proxyidx",
    "journal",
)
# Apart: offloads may keep their own, shorter TTL (``Retention.offloads_apart``).
OFFLOAD_SUFFIX = "offload"

# The expiry (ms) a key written now gets: the log counter's remaining TTL when it has one,
# else the full retention (a conversation without a log, or one from before retention).
EXPIRY_LUA = """
local function expiry_of(ref, ttl)
  local left = redis.call('PTTL', ref)
  if left > 0 then
    return left
  end
  return ttl
end
"""

# KEYS: the conversation's keys. ARGV: the full retention in ms. Missing keys stay missing.
REFRESH_LUA = """
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return 1
"""

# Writes outside a script of their own, each with the conversation's expiry in the same
# script (atomic, and one call on a cluster, where a pipeline cannot run EVAL).
# HASH_OPS: KEYS hash, log counter. ARGV: retention ms, then ops: 'H' field value (HSET),
# 'D' field (HDEL), 'I' field n (HINCRBY, whose result is returned).
HASH_OPS_LUA = (
    EXPIRY_LUA
    + """
local e = expiry_of(KEYS[2], tonumber(ARGV[1]))
local out = 0
local i = 2
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'D' then
    redis.call('HDEL', KEYS[1], ARGV[i + 1])
    i = i + 2
  elseif op == 'I' then
    out = redis.call('HINCRBY', KEYS[1], ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  else
    redis.call('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], e)
end
return out
"""
)

# KEYS: key, log counter. ARGV: value, retention ms.
SET_LUA = (
    EXPIRY_LUA
    + """
redis.call('SET', KEYS[1], ARGV[1], 'PX', expiry_of(KEYS[2], tonumber(ARGV[2])))
return 1
"""
)

# KEYS: list, log counter. ARGV: retention ms, then the list's new items (it is replaced).
REPLACE_LIST_LUA = (
    EXPIRY_LUA
    + """
local e = expiry_of(KEYS[2], tonumber(ARGV[1]))
redis.call('DEL', KEYS[1])
for i = 2, #ARGV do
  redis.call('RPUSH', KEYS[1], ARGV[i])
end
if #ARGV > 1 then
  redis.call('PEXPIRE', KEYS[1], e)
end
return 1
"""
)

# The sweep, in a tenant's slot. KEYS: the listing, the activity set. ARGV: the cutoff
# (epoch seconds), then conversation ids whose keys are gone. An id is unlisted only if its
# activity is still older than the cutoff: an append since (which scores it first, then
# writes the log) keeps it listed. Returns the ids unlisted.
UNLIST_LUA = """
local removed = {}
local cutoff = tonumber(ARGV[1])
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if score and tonumber(score) < cutoff then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
    removed[#removed + 1] = ARGV[i]
  end
end
return removed
"""


def tenant_index_key(prefix: str, tenant_id: str) -> str:
    """The tenant's conversation listing (a sorted set read in lexical order)."""
    return f"{prefix}:tenant:{{{tenant_id}}}:conversations"


def tenant_activity_key(prefix: str, tenant_id: str) -> str:
    """The tenant's conversations scored by last activity (epoch seconds), in the listing's slot."""
    return f"{prefix}:tenant:{{{tenant_id}}}:active"


class RedisRetention:
    """The key names, TTLs and refresh of one prefix's conversations under ``retention``."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        retention: Retention | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.retention = retention or Retention()
        self._clock = clock
        self._hash_ops = client.register_script(HASH_OPS_LUA)
        self._set = client.register_script(SET_LUA)
        self._replace_list = client.register_script(REPLACE_LIST_LUA)

    def ttl_ms(self, key: ConversationKey) -> int:
        """The conversation's full TTL in ms (0: none)."""
        return self.retention.ttl_ms(key.tenant_id)

    def name(self, key: ConversationKey, suffix: str) -> str:
        """One key of the conversation."""
        return f"{self.prefix}:{key.hash_tag}:{suffix}"

    def refreshed_keys(self, key: ConversationKey, skip: Sequence[str] = ()) -> list[str]:
        """The keys a refresh gives the full TTL: every retained key (but ``skip``), and the
        offloads unless they keep their own TTL."""
        suffixes = [s for s in RETAINED_SUFFIXES if s not in skip]
        if not self.retention.offloads_apart(key.tenant_id):
            suffixes.append(OFFLOAD_SUFFIX)
        return [self.name(key, s) for s in suffixes]

    def refresh_due(self, key: ConversationKey, remaining_ms: int) -> bool:
        """True when a window that found ``remaining_ms`` left must refresh (``Retention``)."""
        return self.retention.refresh_due(key.tenant_id, remaining_ms)

    def refresh(self, key: ConversationKey) -> None:
        """Give every key of the conversation the full TTL and score it active: one round
        trip (two calls on a cluster, where the activity set is in another slot)."""
        ttl = self.ttl_ms(key)
        if ttl == 0:
            return
        keys = self.refreshed_keys(key)
        active = tenant_activity_key(self.prefix, key.tenant_id)
        now = self._clock()
        with translated(f"refresh expiry of {key}"):
            if isinstance(self.client, RedisCluster):
                self.client.eval(REFRESH_LUA, len(keys), *keys, ttl)
                self.client.zadd(active, {key.conversation_id: now})
                return
            # EVAL, not EVALSHA: at most hourly per conversation, and a pipeline cannot
            # recover from NOSCRIPT.
            pipe = self.client.pipeline(transaction=False)
            pipe.eval(REFRESH_LUA, len(keys), *keys, ttl)
            pipe.zadd(active, {key.conversation_id: now})
            pipe.execute()

    def touch(self, key: ConversationKey) -> None:
        """``refresh`` when due, for a window that did not read the counter's TTL in its own
        script (one ``PTTL`` more; nothing without a retention)."""
        if self.ttl_ms(key) == 0:
            return
        with translated(f"read expiry of {key}"):
            left = int(self.client.pttl(self.name(key, RETAINED_SUFFIXES[0])))
        if left != -2 and self.refresh_due(key, left):
            self.refresh(key)

    def hash_write(
        self,
        key: ConversationKey,
        name: str,
        *,
        put: Mapping[str, str | int] | None = None,
        remove: Sequence[str] = (),
        incr: tuple[str, int] | None = None,
    ) -> int:
        """Removes, then puts, then an increment on hash ``name`` of the conversation, which
        gets the conversation's expiry: one script (requires a retention). The increment's
        result, else 0."""
        args: list[str | int] = [self.ttl_ms(key)]
        for f in remove:
            args += ["D", f]
        for f, v in (put or {}).items():
            args += ["H", f, v]
        if incr is not None:
            args += ["I", *incr]
        return int(self._hash_ops(keys=[name, self.name(key, RETAINED_SUFFIXES[0])], args=args))

    def set(self, key: ConversationKey, name: str, value: str | int) -> None:
        """SET ``name`` with the conversation's expiry (requires a retention)."""
        self._set(keys=[name, self.name(key, RETAINED_SUFFIXES[0])], args=[value, self.ttl_ms(key)])

    def replace_list(self, key: ConversationKey, name: str, items: Sequence[str]) -> None:
        """Replace list ``name`` by ``items``, with the conversation's expiry (requires a retention)."""
        self._replace_list(keys=[name, self.name(key, RETAINED_SUFFIXES[0])], args=[self.ttl_ms(key), *items])

    def now(self) -> float:
        """The clock appends and refreshes score activity with."""
        return self._clock()
