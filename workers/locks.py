"""Per-conversation locks: two workers never run stages of one conversation at once.

A redis-py ``Lock`` (random token, timeout) is extended by a background thread while the
stage works, so a long model call keeps it; if the worker dies the timeout frees it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError

from ctxcore.errors import ConflictError, StoreUnavailable
from ctxcore.state.keys import ConversationKey

__all__ = ["ConversationBusy", "LockBusy", "conversation_lock", "lock_name"]


class LockBusy(Exception):
    """Another worker holds the conversation's lock."""


class ConversationBusy(ConflictError):
    """A compaction kept the conversation's lock past the wait of a request that needs it
    (a DELETE): nothing was changed; retry shortly. Over HTTP a 409 ``conversation_busy``."""


def lock_name(prefix: str, key: ConversationKey) -> str:
    """The lock's Redis key, under the conversation's hash tag."""
    return f"{prefix}:lock:{key.hash_tag}"


@contextmanager
def conversation_lock(
    client: redis.Redis,
    prefix: str,
    key: ConversationKey,
    timeout: float = 60.0,
    *,
    wait_seconds: float = 0.0,
) -> Iterator[None]:
    """Hold ``key``'s lock for the block, extending it every ``timeout / 3`` seconds.

    Raises ``LockBusy`` if another worker still holds it after ``wait_seconds`` (at once by
    default: a stage requeues instead), ``StoreUnavailable`` when Redis does not answer (a
    stage retries that like a transient failure).
    """
    wait = wait_seconds > 0
    lock = client.lock(
        lock_name(prefix, key),
        timeout=timeout,
        sleep=0.05,
        blocking=wait,
        blocking_timeout=wait_seconds if wait else None,
        thread_local=False,
    )
    try:
        acquired = lock.acquire()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailable(f"Redis unavailable taking the lock of {key}: {exc}") from exc
    if not acquired:
        raise LockBusy(str(key))
    stop = threading.Event()

    def keep_alive() -> None:
        while not stop.wait(timeout / 3):
            try:
                lock.reacquire()
            except (LockError, redis.RedisError):
                return

    thread = threading.Thread(target=keep_alive, name=f"lock-{key}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1)
        # Expired or lost: the next holder's token differs, nothing to undo.
        with contextlib.suppress(LockError, redis.RedisError):
            lock.release()
