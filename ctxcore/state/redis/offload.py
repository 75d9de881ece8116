"""Redis offloads: the originals a view left out, one hash per conversation (see ``ctxcore.state.redis``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, messages_from_json, messages_to_json
from ctxcore.state.filesystem import no_files, put_one, validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis.common import RedisBackend, translated
from ctxcore.state.redis.retention import EXPIRY_LUA, RedisRetention
from ctxcore.state.retention import Retention

__all__ = ["OFFLOAD_TTL_LUA", "PUT_MANY_LUA", "RedisOffloadStore"]

# How an offload write sets the hash's TTL. own: the offloads' own TTL in ms, ret: the
# retention in ms (0: none for either). A shorter own TTL is kept (refreshes skip the hash);
# otherwise the hash gets the conversation's expiry (the log counter's, KEYS[2]).
OFFLOAD_TTL_LUA = (
    EXPIRY_LUA
    + """
local function offload_ttl(own, ret)
  if own > 0 and (ret == 0 or own < ret) then
    redis.call('PEXPIRE', KEYS[1], own)
  elseif ret > 0 then
    redis.call('PEXPIRE', KEYS[1], expiry_of(KEYS[2], ret))
  end
end
"""
)

# HSETNX of (handle, data) pairs of one conversation. KEYS: the offload hash, the log counter.
# ARGV: own ttl ms, retention ms (0: none), then (handle, data) pairs. Returns 1/0 per pair;
# the TTL is set once, when anything was written.
PUT_MANY_LUA = (
    OFFLOAD_TTL_LUA
    + """
local out, any = {}, false
for i = 3, #ARGV, 2 do
  local stored = redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  out[#out + 1] = stored
  if stored == 1 then any = true end
end
if any then
  offload_ttl(tonumber(ARGV[1]), tonumber(ARGV[2]))
end
return out
"""
)


class RedisOffloadStore(RedisBackend):
    """Offloaded originals in one Redis hash per conversation (HSETNX: first write wins).

    With ``ttl_seconds`` the conversation's offloads expire together, ``ttl_seconds`` after
    the latest successful put, so each lives at least that long. With ``retention`` they
    expire with the conversation instead, unless ``ttl_seconds`` is the shorter (then pass
    it as the retention's ``offload_ttl_seconds`` too, so refreshes leave them alone).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "ctxcore",
        ttl_seconds: float | None = None,
        retention: Retention | None = None,
    ) -> None:
        super().__init__(client, prefix)
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ConfigError(f"RedisOffloadStore ttl_seconds must be positive or None, got {ttl_seconds!r}")
        self.ttl_seconds = ttl_seconds
        self._put_many = client.register_script(PUT_MANY_LUA)
        self._retention = RedisRetention(client, prefix, retention)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = "ctxcore",
        ttl_seconds: float | None = None,
        retention: Retention | None = None,
        **client_kwargs: Any,
    ) -> RedisOffloadStore:
        """A store on a new client for ``url``; extra kwargs go to ``redis.Redis.from_url``."""
        return cls(
            redis.Redis.from_url(url, **client_kwargs),
            prefix=prefix,
            ttl_seconds=ttl_seconds,
            retention=retention,
        )

    put_if_absent = put_one

    def put_many_if_absent(
        self, key: ConversationKey, items: Sequence[tuple[str, Sequence[AnyMessage]]]
    ) -> list[bool]:
        """``put_if_absent`` of each item in one script call: the conversation's offloads are
        one hash (one slot on a cluster), so a window's offloads cost one round trip."""
        if not items:
            return []
        # The scripts' own ttl ms and retention ms, then the pairs.
        args: list[str | bytes | int] = [
            round(self.ttl_seconds * 1000) if self.ttl_seconds else 0,
            self._retention.ttl_ms(key),
        ]
        for handle, messages in items:
            args += [validate_handle(handle), messages_to_json(messages)]
        with translated(f"offload to {key}"):
            stored = self._put_many(keys=[self._key(key, "offload"), self._key(key, "log:seq")], args=args)
        return [bool(s) for s in stored]

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None."""
        validate_handle(handle)
        with translated(f"read offload of {key}"):
            data = self._client.hget(self._key(key, "offload"), handle)
        return messages_from_json(data) if data is not None else None

    files = no_files

    def delete(self, key: ConversationKey) -> None:
        """Remove every offload of the conversation."""
        with translated(f"delete offloads of {key}"):
            self._client.delete(self._key(key, "offload"))
