"""What the Redis backends share: error translation and reading replies of either decoding."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)

from ctxcore.errors import ConfigError, StoreError, StoreUnavailable
from ctxcore.state.keys import ConversationKey

__all__ = ["UNAVAILABLE", "RedisBackend", "field", "text", "translated"]

# Errors that mean "the infrastructure is not there right now" rather than "this call is wrong".
# On a cluster: CLUSTERDOWN (a master lost, no replica yet), TRYAGAIN out of retries (a slot
# mid-migration) and the client's own "no node answers" (not a RedisError).
UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    OutOfMemoryError,
    ClusterDownError,
    TryAgainError,
    RedisClusterException,
)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Map redis-py errors to ``StoreUnavailable`` / ``StoreError``, cause chained."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"Redis unavailable during {what}: {exc}") from exc
    except RedisError as exc:
        raise StoreError(f"Redis error during {what}: {exc}") from exc


def text(value: bytes | str) -> str:
    """Clients built with ``decode_responses=True`` return str, others bytes: accept both."""
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: bytes | str) -> bytes:
    """A reply as bytes, whichever way the client decodes responses."""
    return value if isinstance(value, bytes) else value.encode()


def field(fields: dict[Any, Any], name: str) -> bytes | str:
    """A stream entry's field, whichever way the client decodes responses."""
    value: bytes | str = fields[name.encode()] if name.encode() in fields else fields[name]
    return value


_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")


class RedisBackend:
    """The client, key prefix and key naming shared by the Redis backends."""

    def __init__(self, client: redis.Redis, prefix: str = "ctxcore") -> None:
        # A brace in the prefix would become the key's hash tag and scatter a conversation.
        if _PREFIX.fullmatch(prefix) is None:
            raise ConfigError(
                f"invalid Redis key prefix {prefix!r}: use 1-64 of letters, digits, '_', '.', ':', '-'"
            )
        self._client = client
        self.prefix = prefix

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (share it between the backends of one process)."""
        return self._client

    def _key(self, key: ConversationKey, suffix: str) -> str:
        return f"{self.prefix}:{key.hash_tag}:{suffix}"
