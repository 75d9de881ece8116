"""The Redis keys of one ``redis.key_prefix``, found by SCAN and deleted exactly.

Every key ctxcore writes starts with ``<prefix>:`` (state, log, locks) or ``{<prefix>:``
(scheduler, rate limits, circuit breakers and usage hash tags), and Celery's and kombu's
keys (queues, bindings, ``unacked``, task results) get ``<prefix>:`` from the
``global_keyprefix`` in ``workers.app.celery_config``. So a SCAN on these two patterns finds
one deployment's keys, and nothing of another prefix (``demo1a`` never matches ``demo1ab:``).
Never FLUSH: a database is shared.
"""

from __future__ import annotations

import re

import redis

from ctxcore.errors import ConfigError

__all__ = ["delete_prefixed_keys", "prefix_patterns", "prefixed_keys"]

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def prefix_patterns(prefix: str) -> tuple[str, str]:
    """The SCAN ``MATCH`` patterns of ``prefix``'s keys."""
    if not prefix:
        raise ConfigError("an empty key prefix would match every key; pass the deployment's redis.key_prefix")
    escaped = _GLOB_SPECIAL.sub(r"\\\1", prefix)
    return f"{escaped}:*", f"{{{escaped}:*"


def prefixed_keys(client: redis.Redis, prefix: str) -> set[bytes]:
    """Every key of ``prefix`` now in the client's database."""
    found: set[bytes] = set()
    for pattern in prefix_patterns(prefix):
        found.update(client.scan_iter(match=pattern, count=1000))
    return found


def delete_prefixed_keys(client: redis.Redis, prefix: str) -> int:
    """Delete every key of ``prefix`` (SCAN, then DEL in batches); the number deleted."""
    keys = sorted(prefixed_keys(client, prefix))
    deleted = 0
    for start in range(0, len(keys), 500):
        deleted += int(client.delete(*keys[start : start + 500]))
    return deleted
