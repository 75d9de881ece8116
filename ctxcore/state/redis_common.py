"""What the Redis backends share: error translation and reading replies of either decoding."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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

from ctxcore.errors import StoreError, StoreUnavailable

__all__ = ["UNAVAILABLE", "field", "text", "translated"]

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


def field(fields: dict[Any, Any], name: str) -> bytes | str:
    """A stream entry's field, whichever way the client decodes responses."""
    value: bytes | str = fields[name.encode()] if name.encode() in fields else fields[name]
    return value
