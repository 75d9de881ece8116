"""Redis offloads: the originals a view left out, one hash per conversation (see ``ctxcore.state.redis``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, messages_from_json, messages_to_json
from ctxcore.state.filesystem import validate_handle
from ctxcore.state.keys import ConversationKey
from ctxcore.state.redis_common import RedisBackend, translated
from ctxcore.state.redis_scripts import PUT_LUA

__all__ = ["RedisOffloadStore"]


class RedisOffloadStore(RedisBackend):
    """Offloaded originals in one Redis hash per conversation (HSETNX: first write wins).

    With ``ttl_seconds`` the conversation's offloads expire together, ``ttl_seconds`` after
    the latest successful put, so each lives at least that long.
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "ctxcore", ttl_seconds: float | None = None
    ) -> None:
        super().__init__(client, prefix)
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ConfigError(f"RedisOffloadStore ttl_seconds must be positive or None, got {ttl_seconds!r}")
        self.ttl_seconds = ttl_seconds
        self._put = client.register_script(PUT_LUA)

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "ctxcore", ttl_seconds: float | None = None, **client_kwargs: Any
    ) -> RedisOffloadStore:
        """A store on a new client for ``url``; extra kwargs go to ``redis.Redis.from_url``."""
        return cls(redis.Redis.from_url(url, **client_kwargs), prefix=prefix, ttl_seconds=ttl_seconds)

    def put_if_absent(self, key: ConversationKey, handle: str, messages: Sequence[AnyMessage]) -> bool:
        """Store ``messages`` under ``handle`` unless the handle exists."""
        validate_handle(handle)
        ttl_ms = round(self.ttl_seconds * 1000) if self.ttl_seconds else 0
        data = messages_to_json(messages)
        with translated(f"offload to {key}"):
            stored = self._put(keys=[self._key(key, "offload")], args=[handle, data, ttl_ms])
        return bool(stored)

    def get(self, key: ConversationKey, handle: str) -> list[AnyMessage] | None:
        """The stored messages, or None."""
        validate_handle(handle)
        with translated(f"read offload of {key}"):
            data = self._client.hget(self._key(key, "offload"), handle)
        return messages_from_json(data) if data is not None else None

    def delete(self, key: ConversationKey) -> None:
        """Remove every offload of the conversation."""
        with translated(f"delete offloads of {key}"):
            self._client.delete(self._key(key, "offload"))
