"""The proxy's hash index: per conversation, each log message's id, canonical hash and
``message_id``, in log order, in a Redis list beside the log (whatever stores the log).

Matching a request then reads ~100 bytes per logged message instead of the whole log. The
index is a cache the log can always rebuild: it is trusted only while its last id is the
log's last id; anything else (appends through the ctxcore API, ``truncate_after``, a
deleted conversation, a lost race) rebuilds it from the log on the next request. With a
retention every write gives the list the conversation's expiry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from ctxcore.state import ConversationKey, MessageLog
from ctxcore.state.redis.retention import EXPIRY_LUA, RedisRetention
from ctxcore.state.retention import Retention
from workers.proxy.match import entry_hash

__all__ = ["HashIndex", "IndexEntry"]

# Extend the list only where the caller read it ending (ARGV[1], "" for empty); entries a
# concurrent attempt already pushed are skipped; anything else invalidates the index.
# KEYS: the list, the log counter. ARGV: that end, the retention ms (0: none; else the list
# gets the conversation's expiry), then the entries.
_EXTEND_LUA = (
    EXPIRY_LUA
    + """
local last = redis.call('LINDEX', KEYS[1], -1)
local last_id = ''
if last then last_id = string.sub(last, 1, string.find(last, ' ') - 1) end
if last_id == ARGV[1] then
  for i = 3, #ARGV do redis.call('RPUSH', KEYS[1], ARGV[i]) end
  local ttl = tonumber(ARGV[2])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[1], expiry_of(KEYS[2], ttl)) end
  return 1
end
local newest = string.sub(ARGV[#ARGV], 1, string.find(ARGV[#ARGV], ' ') - 1)
if last_id >= newest then return 0 end
redis.call('DEL', KEYS[1])
return -1
"""
)


@dataclass(frozen=True)
class IndexEntry:
    """One logged message: its log id, canonical hash and ``message_id`` (or "")."""

    log_id: str
    digest: str
    message_id: str

    def encode(self) -> str:
        return f"{self.log_id} {self.digest} {self.message_id}"

    @classmethod
    def decode(cls, raw: bytes) -> IndexEntry:
        log_id, digest, message_id = raw.decode().split(" ", 2)
        return cls(log_id, digest, message_id)


class HashIndex:
    """The index over one Redis client and key prefix."""

    def __init__(self, client: redis.Redis, prefix: str, retention: Retention | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self._extend = client.register_script(_EXTEND_LUA)
        self._retention = RedisRetention(client, prefix, retention)

    def _key(self, key: ConversationKey) -> str:
        return f"{self.prefix}:{key.hash_tag}:proxyidx"

    def entries(self, key: ConversationKey, log: MessageLog) -> list[IndexEntry]:
        """Every logged message's entry, from the index when it is current, else rebuilt."""
        name = self._key(key)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.lrange(name, 0, -1)
            raw = pipe.execute()[0]
        entries = [IndexEntry.decode(r) for r in raw]
        last = log.last_id(key)
        if (entries[-1].log_id if entries else None) == last:
            return entries
        messages = log.read_after(key, None)
        entries = [
            IndexEntry(m.context_message_id or "", entry_hash(m), m.message_id or "") for m in messages
        ]
        if self._retention.ttl_ms(key):
            # One script: the list gets the conversation's expiry with its entries.
            self._retention.replace_list(key, name, [e.encode() for e in entries])
            return entries
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(name)
            if entries:
                pipe.rpush(name, *(e.encode() for e in entries))
            pipe.execute()
        return entries

    def extend(self, key: ConversationKey, after: str | None, entries: Sequence[IndexEntry]) -> None:
        """Add the entries of messages appended after log id ``after`` (where the index ended)."""
        if entries:
            counter, ttl = self._retention.name(key, "log:seq"), self._retention.ttl_ms(key)
            self._extend(
                keys=[self._key(key), counter], args=[after or "", ttl, *(e.encode() for e in entries)]
            )

    def delete(self, key: ConversationKey) -> None:
        """Forget the conversation's index."""
        self.client.delete(self._key(key))
